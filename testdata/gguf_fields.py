"""What make_random_models.py and make_quant_moe.py both do: a GGUF file's keys copied into a writer"""
from gguf import GGUFReader, GGUFValueType

def copy_fields(w, r, keep):
    """Every key of the reader r whose name keep(name) takes, written to w with its type"""
    for f in r.fields.values():
        if not keep(f.name): continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]
            else:
                val = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(f.name, val, GGUFValueType.ARRAY, sub_type=sub)
        elif t == GGUFValueType.STRING:
            w.add_key_value(f.name, bytes(f.parts[-1]).decode("utf-8"), t)
        else:
            w.add_key_value(f.name, f.parts[-1].tolist()[0], t)

def copy_tokenizer(w, vocab_file):
    r = GGUFReader(vocab_file)
    copy_fields(w, r, lambda name: name.startswith("tokenizer."))
    return len(r.fields["tokenizer.ggml.tokens"].data)
