#!/usr/bin/env bash
# End-to-end self-test of the harness (about 15-30 s after the jar is built):
# generate -> verify mappers -> reference merge -> verify -> corruption checks.
# Prints one line per check and a closing 'N passed, N failed'; exits 1 on failure.
# Usage: interop/hadoop/selftest.sh [WORDS]   (default 200000)
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
jar="$("$here/build.sh")" || exit 1
words="${1:-200000}"
dir="$(mktemp -d "${TMPDIR:-/tmp}/ifile-selftest.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
h() { java -jar "$jar" "$@"; }

pass=0; fail=0
check() { # check NAME EXPECTED_RC CMD...
  local name="$1" want="$2"; shift 2
  local out rc
  out="$("$@" 2>&1)"; rc=$?
  if [[ "$rc" == "$want" ]]; then pass=$((pass+1)); echo "PASS $name: ${out##*$'\n'}"
  else fail=$((fail+1)); echo "FAIL $name (rc=$rc, wanted $want): $out"; fi
}
flip() { python3 -c 'import sys;p,o=sys.argv[1],int(sys.argv[2]);b=bytearray(open(p,"rb").read());b[o]^=1;open(p,"wb").write(b)' "$@"; }

check generate 0 h generate --mappers 8 --words "$words" --seed 42 --out "$dir"
check expected-equals-sort-uniq 0 bash -c "cat '$dir'/mapper-*.txt | tr ' ' '\n' | LC_ALL=C sort | uniq -c | awk '{print \$2\"\t\"\$1}' | cmp - '$dir/expected.tsv' && echo identical"
for i in 0 1 2 3 4 5 6 7; do
  check "mapper-$i-vs-own-counts" 0 h verify --in "$dir/mapper-$i.ifile" --expected "$dir/mapper-$i.expected.tsv" --allow-duplicates
  check "mapper-$i-layout" 0 h inspect --in "$dir/mapper-$i.ifile" --show 0
done
check mapper-0-vs-global-fails 1 h verify --in "$dir/mapper-0.ifile" --expected "$dir/expected.tsv"
check mapper-0-duplicates-rejected 1 h verify --in "$dir/mapper-0.ifile" --expected "$dir/mapper-0.expected.tsv"
check merge 0 bash -c "java -jar '$jar' merge --out '$dir/merged.ifile' '$dir'/mapper-*.ifile"
check merged-verifies 0 h verify --in "$dir/merged.ifile" --expected "$dir/expected.tsv"
check merged-layout 0 h inspect --in "$dir/merged.ifile" --show 0
check merge-of-7-fails 1 bash -c "java -jar '$jar' merge --out '$dir/m7.ifile' '$dir'/mapper-[0-6].ifile >/dev/null && java -jar '$jar' verify --in '$dir/m7.ifile' --expected '$dir/expected.tsv'"
size=$(stat -c %s "$dir/merged.ifile")
cp "$dir/merged.ifile" "$dir/c1.ifile"; flip "$dir/c1.ifile" $((size / 2))
check flipped-middle-byte-checksum-error 0 bash -c "out=\$(java -jar '$jar' verify --in '$dir/c1.ifile' --expected '$dir/expected.tsv'); rc=\$?; echo \"rc=\$rc \$out\"; [[ \$rc == 1 && \$out == *ChecksumException* ]]"
cp "$dir/merged.ifile" "$dir/c2.ifile"; flip "$dir/c2.ifile" $((size - 1))
check flipped-trailer-checksum-error 0 bash -c "out=\$(java -jar '$jar' verify --in '$dir/c2.ifile' --expected '$dir/expected.tsv'); rc=\$?; echo \"rc=\$rc \$out\"; [[ \$rc == 1 && \$out == *ChecksumException* ]]"
head -c $((size - 7)) "$dir/merged.ifile" > "$dir/c3.ifile"
check truncated-rejected 1 h verify --in "$dir/c3.ifile" --expected "$dir/expected.tsv"

echo "$pass passed, $fail failed"
[[ "$fail" == 0 ]]
