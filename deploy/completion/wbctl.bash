# bash completion for wbctl, the weightbroker admin CLI.
#
# The commands and options are read from the program's own --help, so that
# this file stays right when they change; model names come from
# `wbctl models` on the socket the command line names (or the default one).
# Installed as .../bash-completion/completions/wbctl.

# _wbctl_run ARGS...: the wbctl being completed, on the command line's socket.
_wbctl_run() {
  "${_wbctl_bin:-wbctl}" ${_wbctl_socket:+--socket "$_wbctl_socket"} "$@" 2>/dev/null
}

# The commands that `wbctl --help` lists.
_wbctl_commands() {
  _wbctl_run --help | sed -n '/^commands:/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p'
}

# _wbctl_options [CMD]: the options of CMD and the global ones, from the
# lines of the help that describe options ("  -o wide, --output wide",
# "  MODEL, --model MODEL").
_wbctl_options() {
  { _wbctl_run "$@" --help; [ $# -gt 0 ] && _wbctl_run --help; } |
    grep -E '^  +(-|[A-Z]+, -)' | grep -oE -- '(^|[ ,])(--[a-z][a-z-]*|-[a-z])\b' |
    tr -d ' ,' | { if [ $# -gt 0 ]; then grep -vx -- --version; else cat; fi; } | sort -u
}

# The names of the broker's models (a model on devices has a row each).
_wbctl_models() {
  _wbctl_run --timeout-ms 1000 models | awk 'NR > 1 { print $1 }' | sort -u
}

# _wbctl_files WORD: files and directories, shown as such.
_wbctl_files() {
  compopt -o filenames 2>/dev/null
  mapfile -t COMPREPLY < <(compgen -f -- "$1")
}

_wbctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev='' w cmd='' npos=0 i opts
  [ "$COMP_CWORD" -gt 0 ] && prev=${COMP_WORDS[COMP_CWORD - 1]}
  _wbctl_bin=${COMP_WORDS[0]}
  _wbctl_socket=
  # The command is the first word that is neither an option nor an
  # option's argument; the words after it are its arguments.
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    case $w in
      --socket) _wbctl_socket=${COMP_WORDS[i + 1]}; i=$((i + 1)); continue ;;
      --socket=*) _wbctl_socket=${w#--socket=}; continue ;;
      --timeout-ms | -o | --output | --model) i=$((i + 1)); continue ;;
      -*) continue ;;
    esac
    if [ -z "$cmd" ]; then
      cmd=$w
    else
      npos=$((npos + 1))
    fi
  done
  COMPREPLY=()
  case $prev in
    --socket) _wbctl_files "$cur"; return 0 ;;
    --timeout-ms) return 0 ;;
    -o | --output) mapfile -t COMPREPLY < <(compgen -W "wide json" -- "$cur"); return 0 ;;
    --model) mapfile -t COMPREPLY < <(compgen -W "$(_wbctl_models)" -- "$cur"); return 0 ;;
  esac
  if [[ $cur == -* ]]; then
    if [ -n "$cmd" ]; then
      opts=$(_wbctl_options "$cmd")
    else
      opts=$(_wbctl_options)
    fi
    mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
    return 0
  fi
  if [ -z "$cmd" ]; then
    mapfile -t COMPREPLY < <(compgen -W "$(_wbctl_commands)" -- "$cur")
    return 0
  fi
  case $cmd in
    models | leases | containers | unload | cancel | rollback | sleep | wake)
      [ "$npos" = 0 ] && mapfile -t COMPREPLY < <(compgen -W "$(_wbctl_models)" -- "$cur") ;;
    load)
      # NAME is new; PATH is a file or a directory.
      [ "$npos" = 1 ] && _wbctl_files "$cur" ;;
    rollout)
      # NAME is a model; PATH its new version's file or directory.
      if [ "$npos" = 0 ]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_wbctl_models)" -- "$cur")
      elif [ "$npos" = 1 ]; then
        _wbctl_files "$cur"
      fi ;;
    inspect)
      [ "$npos" = 0 ] && _wbctl_files "$cur" ;;
  esac
  return 0
}

complete -F _wbctl wbctl
