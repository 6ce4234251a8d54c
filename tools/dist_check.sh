#!/bin/sh
# The distribution build (make llm-dist: one binary, the CPU backend in variants picked when it starts)
# against the native one (make llm), on this CPU. Usage: tools/dist_check.sh LLM_DIST LLM TESTDATA MODEL
# VARIANT... (best first, as CPU_VARIANTS). Checks:
#   - each variant's object keeps one global, its llm_cpu_variant_NAME (the rest of its llm.h local);
#   - the variant started by default is the first whose features /proc/cpuinfo lists (the kernels named on the
#     "running on" line), and its greedy text is the native build's, byte for byte;
#   - each variant forced with LLM_CPU_VARIANT gives the native build's text too, on stories260K and MODEL,
#     or, when this CPU lacks its features, is refused with an error naming what is missing;
#   - an unknown name is refused, naming the variants there are;
#   - llm tune times the variants this CPU runs and writes the fastest, with this CPU's id, to the tune file,
#     which a later start then runs ("chosen by llm tune"), unless LLM_CPU_VARIANT says otherwise; a file
#     from another CPU is not used, one naming kernels this build lacks is refused with a warning; the native
#     build's llm tune has nothing to choose.
set -u
dist=$1 native=$2 testdata=$3 model=$4
shift 4
fail=0 err=$(mktemp) tune_dir=$(mktemp -d)
export LLM_TUNE_FILE="$tune_dir/cpu-kernels" # never the user's own
check() { # what, condition (0 = ok)
    if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi
}
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do case " $flags " in *" $f "*) ;; *) return 1 ;; esac; done; return 0; }
fits() { # a variant's features, as the Makefile's MARCH_ flags and llm.h's llm_cpu_supports ask for them
    case $1 in
    avx2) has avx2 fma f16c bmi2 ;;
    avx512) has avx2 fma f16c bmi2 avx512f avx512vl avx512bw avx512dq ;;
    avx512vnni) has avx2 fma f16c bmi2 avx512f avx512vl avx512bw avx512dq avx512_vnni ;;
    *) return 1 ;;
    esac
}
for v in "$@"; do
    globals=$(nm "llm-cpu-$v.o" | awk '$2 ~ /^[BDRT]$/ { print $3 }')
    check "llm-cpu-$v.o keeps one global, llm_cpu_variant_$v (has: $(echo $globals))" \
        "$([ "$globals" = "llm_cpu_variant_$v" ]; echo $?)"
done
best=""
for v in "$@"; do if [ -z "$best" ] && fits "$v"; then best=$v; fi; done
expect_kernels=${best:-plain C}
prompt="Once upon a time"
for m in "$testdata/models/stories260K.gguf" "$model"; do
    want=$("$native" -m "$m" -p "$prompt" -n 48 --temp 0 2>/dev/null)
    got=$("$dist" -m "$m" -p "$prompt" -n 48 --temp 0 2>"$err")
    line=$(grep "running on" "$err")
    check "$m, no LLM_CPU_VARIANT: the $expect_kernels kernels" \
        "$(case "$line" in *"($expect_kernels kernels)"*) echo 0 ;; *) echo 1 ;; esac)"
    check "$m, no LLM_CPU_VARIANT: the native build's ${#want} bytes" \
        "$([ -n "$want" ] && [ "$got" = "$want" ]; echo $?)"
    for v in "$@"; do
        got=$(LLM_CPU_VARIANT=$v "$dist" -m "$m" -p "$prompt" -n 48 --temp 0 2>"$err")
        rc=$?
        if fits "$v"; then
            check "$m, LLM_CPU_VARIANT=$v: the native build's text" \
                "$([ $rc = 0 ] && [ "$got" = "$want" ] && grep -q "($v kernels)" "$err"; echo $?)"
        else
            check "$m, LLM_CPU_VARIANT=$v on a CPU without it: refused ($(cat "$err"))" \
                "$([ $rc != 0 ] && grep -q "which this one lacks" "$err"; echo $?)"
        fi
    done
done
LLM_CPU_VARIANT=sse9 "$dist" -m "$testdata/models/stories260K.gguf" -p "$prompt" -n 4 >/dev/null 2>"$err"
rc=$?
check "LLM_CPU_VARIANT=sse9: refused ($(cat "$err"))" \
    "$([ $rc != 0 ] && grep -q "none of this build's CPU variants ($(echo "$@" | sed 's/ /, /g'))" \
        "$err"; echo $?)"
# llm tune
stories="$testdata/models/stories260K.gguf"
want=$("$native" -m "$stories" -p "$prompt" -n 48 --temp 0 2>/dev/null)
"$dist" tune -m "$stories" >"$tune_dir/out" 2>"$err"
rc=$?
chosen=$(sed -n 's/^kernels //p' "$LLM_TUNE_FILE" 2>/dev/null)
cpu=$(sed -n 's/^cpu //p' "$LLM_TUNE_FILE" 2>/dev/null)
rows=0
for v in "$@"; do if fits "$v" && grep -q "^| $v | " "$tune_dir/out"; then rows=$((rows + 1)); fi; done
runs=0
for v in "$@"; do if fits "$v"; then runs=$((runs + 1)); fi; done
check "llm tune: a row for each of the $runs variants this CPU runs, the fastest ($chosen) written for $cpu" \
    "$([ $rc = 0 ] && [ $rows = $runs ] && [ -n "$cpu" ] && fits "$chosen" && \
        grep -q "^the fastest: $chosen; written to $LLM_TUNE_FILE" "$tune_dir/out"; echo $?)"
got=$("$dist" -m "$stories" -p "$prompt" -n 48 --temp 0 2>"$err")
check "after llm tune: the $chosen kernels, chosen by llm tune, the native build's text" \
    "$([ "$got" = "$want" ] && grep -q "($chosen kernels, chosen by llm tune)" "$err"; echo $?)"
last=""
for v in "$@"; do if fits "$v"; then last=$v; fi; done
if [ -n "$last" ]; then
    printf 'cpu %s\nkernels %s\n' "$cpu" "$last" >"$LLM_TUNE_FILE"
    got=$("$dist" -m "$stories" -p "$prompt" -n 48 --temp 0 2>"$err")
    check "a tune file naming $last: the $last kernels, the native build's text" \
        "$([ "$got" = "$want" ] && grep -q "($last kernels, chosen by llm tune)" "$err"; echo $?)"
    LLM_CPU_VARIANT=$best "$dist" -m "$stories" -p "$prompt" -n 4 --temp 0 >/dev/null 2>"$err"
    check "LLM_CPU_VARIANT=$best over the tune file's $last" \
        "$(grep -q "($best kernels)" "$err"; echo $?)"
    printf 'cpu Other-00000000\nkernels %s\n' "$last" >"$LLM_TUNE_FILE"
    "$dist" -m "$stories" -p "$prompt" -n 4 --temp 0 >/dev/null 2>"$err"
    check "a tune file from another CPU: not used (the $best kernels)" \
        "$(grep -q "($best kernels)" "$err"; echo $?)"
    printf 'cpu %s\nkernels sse9\n' "$cpu" >"$LLM_TUNE_FILE"
    "$dist" -m "$stories" -p "$prompt" -n 4 --temp 0 >/dev/null 2>"$err"
    check "a tune file naming kernels this build lacks: a warning, the $best kernels" \
        "$(grep -q "names the kernels 'sse9'" "$err" && grep -q "($best kernels)" "$err"; echo $?)"
fi
"$native" tune -m "$stories" >"$tune_dir/out" 2>&1
rc=$?
check "the native build's llm tune: nothing to choose" \
    "$([ $rc = 0 ] && grep -q "nothing to choose" "$tune_dir/out"; echo $?)"
rm -rf "$err" "$tune_dir"
[ $fail = 0 ] && echo "dist check: passed" || echo "dist check: FAILED"
exit $fail
