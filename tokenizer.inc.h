// tokenizer implementation goes here
