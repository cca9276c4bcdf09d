#!/usr/bin/env bash
# ab_sed.sh: on the GPU machine, from the repo root: A/B of source edits that no -D knob reaches (a constant of
# mask.h, a #define without #ifndef). Builds both torch-free harnesses (fh: dev/fwd_harness.cu, bh:
# dev/bwd_harness.cu) for the tree as it is (variant "base") and for one copy per NAME=FILE:SED edited by
# `sed -i SED FILE`, NAME=FILE<OTHER with FILE replaced by the tree's file OTHER (a .cu edit rebuilds that
# object only, a header edit every one), or NAME=@DIR, another whole tree (DIR/csrc and DIR/dev, e.g. a branch:
# `git archive BRANCH csrc dev | tar -x -C ab/NAME` here, ab/ travels to the GPU machine as an untracked folder;
# every object rebuilt, its own kernel files), then runs each harness command on every variant, ROUNDS rounds,
# the variants' order rotated per round.
#   bash dev/ab_sed.sh ROUNDS "fh variants 128;bh timev" r7='csrc/mask.h:s/ROUNDS 10/ROUNDS 7/' ...
#   bash dev/ab_sed.sh 5 "bh timev;fh bench 128" inst=@ab/inst   (python3 dev/ab_table.py on the output)
# Output: "== round R NAME: CMD" then the command's own lines. Logs and binaries under $TMPDIR/ab_sed.
set -uo pipefail
rounds=$1 cmds=$2
shift 2
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
W=${TMPDIR:-/tmp}/ab_sed
SRCS="csrc/cuda/*.cu dev/bwd_harness.cu dev/fwd_harness.cu"
KERNELS=$(cd csrc/cuda && ls *.cu | sed "s/\.cu$//")
rm -rf "$W" && mkdir -p "$W/base"
compile() { # dir obj-dir files...
    local d=$1 o=$2
    shift 2
    for f in "$@"; do
        (cd "$d" && nvcc $F -c "$f" -o "$o/$(basename "$f" .cu).o" >"$o/$(basename "$f" .cu).log" 2>&1) ||
            echo "FAIL $o $f" &
    done
}
compile "$PWD" "$W/base" $SRCS
names=base
for v in "$@"; do
    name=${v%%=*} spec=${v#*=}
    if [[ $spec == @* ]]; then # a whole other tree, with the kernel files it has
        mkdir -p "$W/$name/tree" && cp -r "${spec#@}/csrc" "${spec#@}/dev" "$W/$name/tree/"
        (cd "$W/$name/tree/csrc/cuda" && ls *.cu | sed 's/\.cu$//') >"$W/$name/kernels"
        compile "$W/$name/tree" "$W/$name" $(cd "$W/$name/tree" && echo $SRCS)
        names="$names $name"
        continue
    fi
    mkdir -p "$W/$name/tree" && cp -r csrc dev "$W/$name/tree/"
    if [[ $spec == *"<"* ]]; then
        file=${spec%%<*}
        cp "${spec#*<}" "$W/$name/tree/$file"
    else
        file=${spec%%:*}
        sed -i "${spec#*:}" "$W/$name/tree/$file"
    fi
    cmp -s "$file" "$W/$name/tree/$file" && echo "WARNING $name: sed changed nothing in $file"
    case $file in
    *.cu) compile "$W/$name/tree" "$W/$name" "$file" ;;
    *) compile "$W/$name/tree" "$W/$name" $(cd "$W/$name/tree" && echo $SRCS) ;;
    esac
    names="$names $name"
done
wait
for n in $names; do # objects the edit did not rebuild come from base
    kernels=$KERNELS
    [ -f "$W/$n/kernels" ] && kernels=$(cat "$W/$n/kernels")
    for o in $kernels bwd_harness fwd_harness; do
        [ -f "$W/$n/$o.o" ] || ln -s "$W/base/$o.o" "$W/$n/$o.o"
    done
    K=""
    for o in $kernels; do K="$K $W/$n/$o.o"; done
    nvcc $F "$W/$n/bwd_harness.o" $K -o "$W/$n/bh" & nvcc $F "$W/$n/fwd_harness.o" $K -o "$W/$n/fh" &
done
wait
read -ra order <<<"$names"
for ((r = 0; r < rounds; r++)); do
    IFS=';' read -ra cl <<<"$cmds"
    for c in "${cl[@]}"; do
        k=$((r % ${#order[@]}))
        for n in "${order[@]:k}" "${order[@]:0:k}"; do
            echo "== round $r $n: $c"
            set -- $c
            bin=$1
            shift
            timeout 200 "$W/$n/$bin" "$@" || echo "FAILED rc $?"
        done
    done
done
