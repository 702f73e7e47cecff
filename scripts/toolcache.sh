# Sourced by scripts/jaeger, scripts/prometheus, scripts/collector and scripts/staticcheck:
# builds a pinned tool from the Go module proxy into the otelpgxtx cache, once. The module is built inside its own directory as the
# proxy serves it, so its go.mod and go.sum pin every dependency exactly as upstream builds
# it (`go install pkg@version` refuses modules with replace or exclude directives), and the
# library's go.mod never sees them.
#
# OTELPGXTX_CACHE overrides the cache directory (default ${XDG_CACHE_HOME:-~/.cache}/otelpgxtx).
# TOOL_STEP (e.g. "1/2", set by `make tools`) numbers the tool in the progress lines.

tool_cache_dir() {
  echo "${OTELPGXTX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/otelpgxtx}/$1"
}

# build_tool LABEL MODULE VERSION DIR LDFLAGS TAGS PKG...
# builds every PKG (relative to the module root) into DIR, printing progress on stderr.
# MODULE is a module path on the proxy, or a directory of this repository holding a
# module of its own (its go.mod and go.sum pin what the proxy is asked for).
build_tool() {
  local label=$1 module=$2 version=$3 dir=$4 ldflags=$5 tags=$6
  shift 6
  local step=${TOOL_STEP:+ [tool $TOOL_STEP]}
  mkdir -p "$dir"
  local start tmp src beat
  start=$(date +%s)
  # A temporary directory so that an interrupted build never leaves a half-written binary.
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  # A heartbeat, so that a first run's minutes of compiling do not look hung.
  ( while sleep 30 && kill -0 $$ 2>/dev/null; do echo "  … still building $label ($(( $(date +%s) - start ))s)" >&2; done ) &
  beat=$!
  trap "kill $beat 2>/dev/null; rm -rf '$tmp'" EXIT
  echo "building $label ${version}${step} … 1/2 downloading $module and its dependencies" >&2
  if [ -d "$module" ]; then
    src=$(cd "$module" && pwd)
  else
    src=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "${module}@${version}" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  fi
  [ -n "$src" ] || { echo "build_tool: go mod download $module@$version gave no directory" >&2; return 1; }
  local p
  local pkgs=()
  for p in "$@"; do pkgs+=("./$p"); done
  (cd "$src" && GOWORK=off GOFLAGS="-mod=readonly" go list -tags "$tags" -deps "${pkgs[@]}" >/dev/null)
  # Each program is named after its package's directory ("." is the module's own).
  local names=()
  for p in "$@"; do names+=("$(basename "$(cd "$src/$p" && pwd)")"); done
  echo "building $label ${version}${step} … 2/2 compiling ${names[*]} (takes minutes the first time)" >&2
  local i
  for i in "${!pkgs[@]}"; do
    (cd "$src" && GOWORK=off GOFLAGS="-buildvcs=false -mod=readonly" go build -trimpath -tags "$tags" \
      -ldflags "$ldflags" -o "$tmp/${names[$i]}" "${pkgs[$i]}")
  done
  for p in "${names[@]}"; do mv "$tmp/$p" "$dir/"; done
  echo "built $label ${version} in $(( $(date +%s) - start ))s into $dir" >&2
}
