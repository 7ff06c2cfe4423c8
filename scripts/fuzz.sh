#!/usr/bin/env bash
# Fuzzes for a while and keeps what was found.
#   scripts/fuzz.sh [SECONDS] [FUZZER...]
# Builds what the fuzzers need (scripts/build.sh fuzz: the fuzzers and the
# seed generator, in build-fuzz/; a later run rebuilds only what changed),
# adds the generated seeds a corpus lacks (checkpoint_dir_seeds: those of
# fuzz/corpus/checkpoint_dir and fuzz/corpus/package_records, so a fresh
# clone without them starts from real saves), then runs each fuzzer named
# (default: all of fuzz/CMakeLists.txt's) for SECONDS (default 600) over its
# corpus fuzz/corpus/NAME, one at a time. New inputs go to a scratch
# directory and are merged back at the end (-merge=1: the corpus keeps
# every file it had and gains those that add coverage), so the repository's
# corpus grows; commit it. Prints per fuzzer: executions, coverage
# (libFuzzer's final cov: and ft:) and corpus size (inputs and KB).
# A crash, sanitizer report, timeout or out-of-memory stops that fuzzer;
# its input is kept in fuzz/crashes/ (gitignored) with its log and the
# command that reproduces it, the others still run, and the script exits 1.
#   FUZZ_FLAGS  extra libFuzzer flags for every run (e.g. -jobs=2 -workers=2)
#   JOBS        parallel compile jobs for the build (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
all=(safetensors_header_fuzzer index_fuzzer package_records_fuzzer checkpoint_dir_fuzzer)
fuzzers=("$@")
((${#fuzzers[@]})) || fuzzers=("${all[@]}")

corpus_of() {  # the corpus directory's name under fuzz/corpus
  case "$1" in
    safetensors_header_fuzzer) echo safetensors ;;
    *) echo "${1%_fuzzer}" ;;
  esac
}
dict_of() {  # -dict=... where the fuzzer has one
  local d="fuzz/${1%_fuzzer}.dict"
  [[ -f $d ]] && echo "-dict=$d" || true
}

bash scripts/build.sh fuzz

# Generated seeds a corpus lacks (those it has stay: a seed written anew
# differs in its times only).
seeds=$(mktemp -d)
build-fuzz/checkpoint_dir_seeds "$seeds/checkpoint_dir" "$seeds/package_records" >/dev/null
for dir in "$seeds"/*; do
  mkdir -p "fuzz/corpus/${dir##*/}"
  for seed in "$dir"/*; do
    [[ -e fuzz/corpus/${dir##*/}/${seed##*/} ]] || cp "$seed" "fuzz/corpus/${dir##*/}/"
  done
done
rm -rf "$seeds"

mkdir -p fuzz/crashes
failed=0
for f in "${fuzzers[@]}"; do
  [[ -x build-fuzz/$f ]] || { echo "no fuzzer $f (have: ${all[*]})" >&2; exit 2; }
  corpus=fuzz/corpus/$(corpus_of "$f")
  mkdir -p "$corpus"
  before=$(find "$corpus" -type f | wc -l)
  work=$(mktemp -d); log=$(mktemp)
  echo "=== $f: ${seconds}s over $corpus ($before inputs)"
  rc=0
  # shellcheck disable=SC2046,SC2086
  "build-fuzz/$f" $(dict_of "$f") -max_total_time="$seconds" -timeout=30 -print_final_stats=1 \
    -artifact_prefix="fuzz/crashes/$f-" ${FUZZ_FLAGS:-} "$work" "$corpus" >"$log" 2>&1 || rc=$?
  runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  if ((rc != 0)); then
    failed=1
    artifact=$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)
    grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$log" | head -5 || true
    if [[ -n $artifact ]]; then
      cp "$log" "$artifact.log"
      repro="build-fuzz/$f $artifact"
      echo "$repro" >"$artifact.repro"
      echo "$f: FAILED after ${runs:-?} runs; input $artifact, log $artifact.log"
      echo "  reproduce: $repro"
    else
      tail -20 "$log"
      echo "$f: FAILED (exit $rc), no input saved; log kept in $log"
    fi
  fi
  # Merge what this run found (also after a failure: the inputs before it).
  "build-fuzz/$f" -merge=1 -timeout=30 "$corpus" "$work" >>"$log.merge" 2>&1 ||
    echo "$f: merge failed (see $log.merge)" >&2
  after=$(find "$corpus" -type f | wc -l)
  echo "$f: ${runs:-?} runs, ${cov:-cov: ?}, corpus $before -> $after inputs" \
    "($(du -sk --apparent-size "$corpus" | cut -f1) KB)"
  rm -rf "$work" "$log.merge"
  ((rc != 0)) || rm -f "$log"
done
exit $failed
