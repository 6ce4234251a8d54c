/* test.c - the test suite. Plain C, no framework: each test_* function checks real values with CHECK and the
 * run ends with the line "N passed, N failed". Test data is read from ../shared (see its README). */
#define LLM_IMPLEMENTATION
#include "llm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n_passed, n_failed;
#define CHECK(cond, ...) do { if (cond) n_passed++; else { n_failed++; printf("FAIL %s:%d: ", __FILE__, __LINE__); \
    printf(__VA_ARGS__); printf("\n"); } } while (0)

static const char *shared_dir = "../shared";

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); fclose(f); return NULL; }
    buf[n] = 0; fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

#include "tokenizer_tests.inc.c"
#ifdef LLM_CUDA
#include "gpu_tests.inc.c"   /* run_gpu_tests(): CUDA kernels against the CPU reference */
#endif

int main(int argc, char **argv) {
    int gpu = argc > 1 && !strcmp(argv[1], "--gpu");
    if (argc > 1 + gpu) shared_dir = argv[1 + gpu];
#ifdef LLM_CUDA
    if (gpu) {
        run_gpu_tests();
        printf("%d passed, %d failed\n", n_passed, n_failed);
        return n_failed ? 1 : 0;
    }
#endif
    test_tokenizer_fixtures();
    test_detokenizer_streaming();
    test_tokenizer_api();
    test_tokenizer_odd_vocabularies();
    test_pretokenizers();
    test_detokenizer_references();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
