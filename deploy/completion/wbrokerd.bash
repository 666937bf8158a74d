# bash completion for wbrokerd, the weightbroker daemon.
#
# The options, and the values of those that take one of a few words
# ("--backend auto|cuda|host"), are read from `wbrokerd --help`, so that this
# file stays right when they change. Installed as
# .../bash-completion/completions/wbrokerd.

_wbrokerd() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev='' help words
  [ "$COMP_CWORD" -gt 0 ] && prev=${COMP_WORDS[COMP_CWORD - 1]}
  help=$("${COMP_WORDS[0]}" --help 2>/dev/null)
  COMPREPLY=()
  case $prev in
    --socket | --config)
      compopt -o filenames 2>/dev/null
      mapfile -t COMPREPLY < <(compgen -f -- "$cur")
      return 0
      ;;
    --model)
      # NAME=PATH: the path after '='.
      if [[ $cur == *=* ]]; then
        compopt -o filenames 2>/dev/null
        mapfile -t COMPREPLY < <(compgen -f -P "${cur%%=*}=" -- "${cur#*=}")
      fi
      return 0
      ;;
    --log-level)
      mapfile -t COMPREPLY < <(compgen -W "debug info warn error" -- "$cur")
      return 0
      ;;
    --*)
      # An option of a few words: "  --backend auto|cuda|host".
      words=$(printf '%s\n' "$help" | sed -n "s/^ *$prev \([a-z0-9-]*|[a-z0-9|-]*\).*/\1/p" | tr '|' ' ')
      if [ -n "$words" ]; then
        mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
        return 0
      fi
      # Any other option with an argument: nothing to offer.
      if printf '%s\n' "$help" | grep -qE -- "^ *$prev [A-Z]"; then
        return 0
      fi
      ;;
  esac
  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(printf '%s\n' "$help" | grep -oE -- '--[a-z][a-z-]*' | sort -u)" -- "$cur")
  fi
  return 0
}

complete -F _wbrokerd wbrokerd
