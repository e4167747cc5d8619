#!/usr/bin/env bash
# PTX modules of other revisions, or of this tree built with other settings, for A/B timing on
# the GPU machine through FLASH_ATTN_PTX (the main module) and FLASH_ATTN_HOPPER_PTX (the Hopper
# one) with a single host binary: gzipped into bundle/ptx/, which a call script gunzips. Run it
# after `cargo xtask bundle` (which empties bundle/).
#
# Usage: lab/scripts/ptx_variants.sh NAME=REV[:VAR=VALUE...] ...
#   REV    a git revision, built in a worktree under $VARIANTS (default /tmp/flash-attn-variants:
#          outside the repository, else cargo takes the worktree's kernels crate for a member of
#          this tree's workspace), or `.` for this tree
#   VAR    environment for the kernels' build, e.g. FLASH_ATTN_FA3_EXP2_POLYNOMIAL_EVERY=2
# Writes bundle/ptx/NAME_hopper.ptx.gz and NAME_main.ptx.gz; with SUBSET set (a regex of entry
# names, e.g. 'fa2tc_forward_bf16_d(64|128)_.*'), the main module keeps only those entries
# (lab/scripts/ptx_subset.py: the driver JIT-compiles a whole module on load, over a minute for ours).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
variants=${VARIANTS:-/tmp/flash-attn-variants}
mkdir -p bundle/ptx target/variants "$variants"
for spec in "$@"; do
  name=${spec%%=*}
  rest=${spec#*=}
  IFS=: read -r rev settings <<< "$rest"
  # Settings after the first `:` are `VAR=VALUE`, separated by further `:`.
  env_args=()
  if [ -n "${settings:-}" ]; then IFS=: read -ra env_args <<< "$settings"; fi
  if [ "$rev" = "." ]; then
    tree=$root
  else
    tree=$variants/$(git rev-parse --short "$rev")
    [ -d "$tree" ] || git worktree add --detach "$tree" "$rev" > /dev/null
  fi
  echo "$name: ${rev} ${env_args[*]:-}"
  (cd "$tree" && env "${env_args[@]}" cargo xtask ptx > "$root/target/variants/$name.log" 2>&1) \
    || { tail -20 "$root/target/variants/$name.log"; exit 1; }
  gzip -c "$tree/target/ptx/flash_attn_hopper_sm_90a.ptx" > "bundle/ptx/${name}_hopper.ptx.gz"
  main=$tree/target/ptx/flash_attn_sm_90.ptx
  if [ -n "${SUBSET:-}" ]; then
    python3 lab/scripts/ptx_subset.py "$main" "target/variants/${name}_main.ptx" "$SUBSET"
    main=target/variants/${name}_main.ptx
  fi
  gzip -c "$main" > "bundle/ptx/${name}_main.ptx.gz"
done
du -sh bundle
