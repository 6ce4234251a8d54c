/* fuzz_server.h - server.c in a fuzz target, as main.c takes it in: llm.h's implementation, a now_s(), then
 * the file itself. Its network loop, endpoints and serve() go unused (built with -Wno-unused-function). */
#define _GNU_SOURCE
#define LLM_IMPLEMENTATION
#include "llm.h"
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) { return llm_now(); } /* as main.c's */

#include "server.c"
#include "fuzz/fuzz_common.h"
