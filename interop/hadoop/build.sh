#!/usr/bin/env bash
# Builds interop/hadoop/target/ifile-harness.jar (shaded: Hadoop + deps inside)
# if it is missing or older than pom.xml / src/. Idempotent, non-interactive
# (safe with CI=true and no stdin). Prints the jar's absolute path on stdout;
# Maven's own output goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
jar="$here/target/ifile-harness.jar"

need_build=0
if [[ ! -f "$jar" ]]; then
  need_build=1
elif [[ -n "$(find "$here/pom.xml" "$here/src" -newer "$jar" -print -quit)" ]]; then
  need_build=1
fi

if [[ "$need_build" == 1 ]]; then
  command -v mvn >/dev/null || { echo "build.sh: mvn not found (apt-get install maven)" >&2; exit 1; }
  command -v java >/dev/null || { echo "build.sh: java not found (JDK 17+ needed)" >&2; exit 1; }
  # -B: batch mode (no prompts); -ntp: no download progress noise. Maven's
  # output goes to target/build.log and is shown only if the build fails.
  mkdir -p "$here/target"
  log="$here/target/build.log"
  if ! (cd "$here" && mvn -q -B -ntp -Dstyle.color=never ${MVN_ARGS:-} package -DskipTests </dev/null) >"$log" 2>&1; then
    cat "$log" >&2
    echo "build.sh: maven build failed (log: $log)" >&2
    exit 1
  fi
  [[ -f "$jar" ]] || { echo "build.sh: build finished but $jar is missing" >&2; exit 1; }
fi
echo "$jar"
