# shellcheck shell=sh
# Each script uses some of these helpers, never all (SC2317: unreachable).
# shellcheck disable=SC2317
set -f
fail() { printf 'sandcell:%s:%s\n' "$1" "$2" >&2; exit 90; }
R=$(cd -- "${1:-.}" 2>/dev/null && pwd -P) || fail not_found "the workspace directory ${1:-.} is missing"
[ "$R" = / ] && R=
shift
# confine REL: every existing prefix of REL that is a symlink must resolve inside $R.
confine() {
  acc=
  saved_ifs=$IFS
  IFS=/
  for part in $1; do
    acc=${acc:+$acc/}$part
    if [ -L "$R/$acc" ]; then
      target=$(readlink -f -- "$R/$acc") || target=
      case $target/ in
        "$R"/*) ;;
        *) IFS=$saved_ifs; fail permission_denied "$acc is a symlink that leads outside the workspace" ;;
      esac
    elif [ ! -e "$R/$acc" ]; then
      break
    fi
  done
  IFS=$saved_ifs
}
# confine_parent REL: as confine for REL's directory; REL itself may be a symlink.
confine_parent() {
  case $1 in */*) confine "${1%/*}" ;; esac
}
exists() { [ -e "$1" ] || [ -L "$1" ]; }
