static void test_tokenizer_fixtures(void) {}
static void test_detokenizer_streaming(void) {}
