#!/usr/bin/env bash
# `qkv completion bash|zsh`: the script loads in the shell and completes what the binary accepts.
#   completion.sh QKV
# The oracle is the binary's own help text (`qkv --help`, `qkv help COMMAND`), parsed here
# independently of the C++ that writes the script. zsh (apt package zsh) is checked when installed.
set -uo pipefail
qkv=$1
fail() { echo "FAIL: $*"; exit 1; }
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
ln -s "$(realpath "$qkv")" "$bin/qkv"
PATH=$bin:$PATH

# The commands, from the "Subcommands:" block of qkv --help.
commands=$(qkv --help | sed -n '/^Subcommands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }' | sort | tr '\n' ' ')
[[ $commands == *generate* && $commands == *completion* ]] || fail "qkv --help lists no commands: '$commands'"

source <(qkv completion bash) || fail "the bash script does not load"
complete -p qkv | grep -q -- '-F _qkv' || fail "complete -p qkv: $(complete -p qkv 2>&1)"

# complete WORD...: what _qkv offers for the command line `WORD...` (the last word is completed).
complete_line() {
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _qkv
  ((${#COMPREPLY[@]})) && printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' '
}
expect() {
  local want=$1; shift
  local got
  got=$(complete_line "$@")
  echo "qkv ${*:2} -> $got"
  [[ $got == "$want" ]] || fail "completing '$*': got '$got', expected '$want'"
}

expect "$commands" qkv ""
expect "$commands" qkv --threads 2 ""
expect "generate " qkv gen
expect "--temperature " qkv generate --temp
expect "bf16 f32 " qkv generate --weights ""
expect "bash zsh " qkv completion ""
expect "$commands" qkv help ""
expect "--no-bias " qkv params --no-b
expect "gelu swiglu " qkv params --preset gpt2 --mlp ""
expect "chars " qkv train --tokenizer ch
# A value without fixed choices: nothing offered, so `complete -o default` offers file names.
expect "" qkv generate --model ""

# Every command: the options offered after '-' are exactly those its help lists.
for cmd in $commands; do
  want=$(qkv help "$cmd" | grep -oE -- '(^|[ ,!])--?[a-zA-Z][a-zA-Z0-9-]*' | sed 's/^[ ,!]//' | sort -u | tr '\n' ' ')
  got=$(complete_line qkv "$cmd" -)
  echo "qkv $cmd - -> $got"
  [[ -n $want && $got == "$want" ]] || fail "qkv $cmd: completion offers '$got', its help lists '$want'"
done

if command -v zsh >/dev/null; then
  # zsh's bashcompinit registers the function and calls it under `emulate sh` (compgen -F): the
  # same call here, on two command lines.
  got=$(zsh -c 'autoload -U compinit && compinit -u
    source <(qkv completion zsh) && [[ ${_comps[qkv]} == *"-F _qkv"* ]] || exit 1
    offer() { emulate -L sh; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _qkv; echo "${COMPREPLY[@]}"; }
    offer qkv generate --weights ""; offer qkv ""') || fail "zsh: the script does not register a completion for qkv"
  echo "zsh: $got"
  weights=$(sed -n 1p <<<"$got")
  names=$(sed -n 2p <<<"$got" | tr ' ' '\n' | sort | tr '\n' ' ')
  [[ $weights == "f32 bf16" && $names == "$commands" ]] || fail "zsh: completions '$got'"
else
  echo "zsh is not installed: only the bash script was checked"
fi
echo ok
