/* fuzz_server.h - server.c in a fuzz target, as main.c takes it in: llm.h's implementation, the two functions
 * main.c lends server.c (now_s, proc_memory_bytes), then the file itself. Its network loop, endpoints and
 * serve() go unused (built with -Wno-unused-function). */
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
/* main.c reads /proc/self/status for /metrics; a fuzz target answers "none" (-1), as off Linux */
static double proc_memory_bytes(const char *field) { (void)field; return -1; }

#include "server.c"
#include "fuzz/fuzz_common.h"
