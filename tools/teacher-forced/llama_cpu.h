/* llama_cpu.h - what llama_tf.c and llama_greedy.c share (included after llama.h and stdio.h): llama.cpp
 * with the model on the CPU only, the yardstick being llama.cpp's CPU path, and a batch of one sequence. */

/* The backend started and the model at path loaded with no layer on a GPU; NULL (said on stderr) if not */
static struct llama_model *load_cpu_model(const char *path) {
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) fprintf(stderr, "load failed\n");
    return m;
}

/* ids[pos..pos+n) at positions pos..pos+n-1 of sequence 0, with the logits of every position (all_logits)
 * or of the last only; the caller frees it (llama_batch_free) */
static struct llama_batch one_sequence(const int *ids, int pos, int n, int all_logits) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[pos + i]; b.pos[i] = pos + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
        b.logits[i] = all_logits || i == n - 1;
    }
    b.n_tokens = n;
    return b;
}
