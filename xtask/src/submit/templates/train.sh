#!/usr/bin/env bash
#SBATCH --job-name={{trial}}-train
#SBATCH --nodes={{job_nodes}}
#SBATCH --ntasks-per-node={{tasks_per_node}}
{{train_resources}}
#SBATCH --time={{worker_time}}
#SBATCH --export=ALL
#SBATCH --chdir={{areal_dir}}
#SBATCH --output={{submission_dir}}/train-%j.log
{{site_directives}}
#
# The arena-rl GPU job of trial {{trial}} (profile {{profile}}), submitted by controller.sbatch after its
# preflight passed. Rendered by `cargo xtask submit` on {{host}} at {{timestamp}}; docs/slurm.md explains it.
{{placement}}
# It holds no credential: each step sources ARENA_CREDENTIALS_FILE itself.
set -euo pipefail
set +x

# Launch values. They are set again after the credentials file is sourced: explicit launch values win.
launch_values() {
{{launch_values}}
}
launch_values

gpus_per_node={{gpus_per_node}}
replicas_per_node={{replicas_per_node}}
gpus_per_replica={{gpus_per_replica}}
# The FSDP2 worker: torchrun over the first trainer_nodes nodes, trainer_ranks_per_node ranks each (0: burn
# trains inside `arena-rl train`, no worker).
trainer_nodes={{trainer_nodes}}
trainer_ranks_per_node={{trainer_ranks_per_node}}

# The address of the FSDP2 worker's rank 0, which serves the protocol. torchrun's c10d rendezvous may give
# rank 0 to any trainer node, and only rank 0 listens on ARENA_RL_TRAINER_PORT: with several trainer nodes,
# the first that accepts a connection on it is rank 0's.
worker_rank0() {
    local hosts host t
    IFS=, read -r -a hosts <<<"$ARENA_TRAINER_NODES"
    if ((${#hosts[@]} == 1)); then
        echo "${hosts[0]}:$ARENA_RL_TRAINER_PORT"
        return 0
    fi
    for ((t = 0; t < {{worker_ready_seconds}}; t++)); do
        for host in "${hosts[@]}"; do
            if (exec 3<>"/dev/tcp/$host/$ARENA_RL_TRAINER_PORT") 2>/dev/null; then
                echo "$host:$ARENA_RL_TRAINER_PORT"
                return 0
            fi
        done
        sleep 1
    done
    echo "train: no trainer node ($ARENA_TRAINER_NODES) listens on ARENA_RL_TRAINER_PORT=$ARENA_RL_TRAINER_PORT after {{worker_ready_seconds}} s" >&2
    return 1
}

# One role, run by srun (inside the container): `train.sbatch --step trainer|fsdp2-worker|policy-server`.
if [[ "${1:-}" == --step ]]; then
    set -a
    # shellcheck disable=SC1090
    . "$ARENA_CREDENTIALS_FILE"
    set +a
    launch_values
    for name in ARENA_OPENAPI_BASE ARENA_OPENAPI_TOKEN ARENA_LLM_API_KEY SWE_RL_ADMIN_API_KEY; do
        if [[ -z "${!name:-}" ]]; then
            echo "train: $name is not set; export it from $ARENA_CREDENTIALS_FILE" >&2
            exit 2
        fi
    done
    unset ALL_PROXY HTTP_PROXY HTTPS_PROXY all_proxy http_proxy https_proxy
    cd "$AREAL_DIR"
    case "${2:-}" in
        trainer)
            if ((trainer_ranks_per_node > 0)); then
                ARENA_TRAINER_ATTACH="$(worker_rank0)"
                echo "train: the loop attaches to the fsdp2 worker's rank 0 at $ARENA_TRAINER_ATTACH"
            fi
            exec "$ARENA_RL_BIN" {{run_command}} --config "$CONFIG_PATH" \
{{train_args}}
            ;;
        fsdp2-worker)
            # One torchrun per trainer node; rank 0 serves arena-rl-trainer/1 to the loop on every interface,
            # so it requires the job's key, which travels in the environment only.
            if [[ -z "${ARENA_RL_TRAINER_API_KEY:-}" ]]; then
                echo "train: ARENA_RL_TRAINER_API_KEY is not set; the fsdp2 worker on every interface needs one" >&2
                exit 2
            fi
            mkdir -p "$ARENA_RUN_DIR"
            # The worker of this checkout, which speaks the protocol of the binary built from it.
            PYTHONPATH="$AREAL_DIR/crates/fsdp2-trainer/worker${PYTHONPATH:+:$PYTHONPATH}"
            export PYTHONPATH
            if ((gpus_per_node == 0)); then
                export ARENA_RL_TRAINER_DEVICE=cpu
            fi
            exec "$ARENA_RL_TRAINER_PYTHON" -m torch.distributed.run --nnodes "$trainer_nodes" \
                --nproc-per-node "$trainer_ranks_per_node" --rdzv-backend c10d \
                --rdzv-endpoint "$ARENA_TRAINER_RDZV" --rdzv-id "$SLURM_JOB_ID" --max-restarts 0 \
                -m arena_rl_fsdp2 --listen "0.0.0.0:$ARENA_RL_TRAINER_PORT" --run-dir "$ARENA_RUN_DIR"
            ;;
        policy-server)
            if [[ -z "${ARENA_RL_POLICY_API_KEY:-}" ]]; then
                echo "train: ARENA_RL_POLICY_API_KEY is not set; a policy server on every interface needs one" >&2
                exit 2
            fi
            # One replica per task: its port and its GPUs follow its rank on the node.
            local_id="${SLURM_LOCALID:-0}"
            if ((gpus_per_replica > 0)); then
                IFS=, read -r -a gpus <<<"${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((gpus_per_node - 1)))}"
                mine=("${gpus[@]:local_id*gpus_per_replica:gpus_per_replica}")
                CUDA_VISIBLE_DEVICES="$(IFS=,; echo "${mine[*]}")"
                export CUDA_VISIBLE_DEVICES
            fi
{{policy_server_exec}}
            ;;
        *)
            echo "train: unknown step '${2:-}'" >&2
            exit 2
            ;;
    esac
fi

mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
trainer_node="${nodes[0]}"
worker_nodes=("${nodes[@]:0:trainer_nodes}")
serve_nodes=("${nodes[@]:trainer_nodes}")
servers=()
for node in "${serve_nodes[@]}"; do
    for ((i = 0; i < replicas_per_node; i++)); do
        servers+=("http://$node:$((ARENA_POLICY_PORT + i))")
    done
done
ARENA_POLICY_SERVERS="$(IFS=,; echo "${servers[*]}")"
export ARENA_POLICY_SERVERS
echo "train: trial $TRIAL_NAME: trainer on $trainer_node; policy servers: ${ARENA_POLICY_SERVERS:-in-process}"
if ((trainer_ranks_per_node > 0)); then
    ARENA_TRAINER_NODES="$(IFS=,; echo "${worker_nodes[*]}")"
    ARENA_TRAINER_RDZV="$trainer_node:$ARENA_RL_RDZV_PORT"
    export ARENA_TRAINER_NODES ARENA_TRAINER_RDZV
    echo "train: fsdp2 worker: $trainer_ranks_per_node rank(s) on each of $ARENA_TRAINER_NODES, rendezvous at $ARENA_TRAINER_RDZV"
fi

trainer_container=()
worker_container=()
server_container=()
if [[ "$AREAL_CONTAINER_BIN" != none ]]; then
    run=("$AREAL_CONTAINER_BIN" exec --no-eval --pid --writable-tmpfs)
    if ((gpus_per_node > 0)); then
        run+=(--nv)
    fi
    trainer_container=("${run[@]}" --bind "$AREAL_WORKER_MOUNTS" "$AREAL_IMAGE")
    worker_container=("${run[@]}" --bind "$AREAL_WORKER_MOUNTS" "${TRAINER_IMAGE:-$AREAL_IMAGE}")
    server_container=("${run[@]}" --bind "$AREAL_WORKER_MOUNTS" "$ROLLOUT_IMAGE")
fi

# The policy servers listen on every interface, and whoever reaches one can pause it or load weights from
# any path: they require a key, and only this job's trainer holds it. One random key per job, unless the
# credentials file sets ARENA_RL_POLICY_API_KEY; it travels in the environment, never on a command line.
if [[ -z "${ARENA_RL_POLICY_API_KEY:-}" ]]; then
    ARENA_RL_POLICY_API_KEY="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"
fi
export ARENA_RL_POLICY_API_KEY
# The same for the FSDP2 worker's protocol: the loop and the worker hold one random key per job, unless the
# credentials file sets ARENA_RL_TRAINER_API_KEY.
if ((trainer_ranks_per_node > 0)); then
    if [[ -z "${ARENA_RL_TRAINER_API_KEY:-}" ]]; then
        ARENA_RL_TRAINER_API_KEY="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"
    fi
    export ARENA_RL_TRAINER_API_KEY
fi

# Each step asks for its CPUs: the trainer every CPU the job holds on its node, each policy server its share
# of the fewest the job holds on a policy server's node. A job that does not take its nodes whole may hold a
# different number on each: SLURM_JOB_CPUS_PER_NODE lists them in node order ("2(x2),1").
job_cpus=()
IFS=, read -r -a cpu_groups <<<"${SLURM_JOB_CPUS_PER_NODE:-${SLURM_CPUS_ON_NODE:-1}}"
for group in "${cpu_groups[@]}"; do
    count=1
    if [[ "$group" =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
        group="${BASH_REMATCH[1]}"
        count="${BASH_REMATCH[2]}"
    fi
    for ((i = 0; i < count; i++)); do
        job_cpus+=("$group")
    done
done
node_cpus="${job_cpus[0]:-1}"
server_cpus=""
for cpus in "${job_cpus[@]:trainer_nodes}"; do
    if [[ -z "$server_cpus" ]] || ((cpus < server_cpus)); then
        server_cpus="$cpus"
    fi
done
server_cpus=$((${server_cpus:-1} / (replicas_per_node > 0 ? replicas_per_node : 1)))
((server_cpus > 0)) || server_cpus=1

servers_pid=""
if ((${#serve_nodes[@]} > 0)); then
    # --ntasks: a step inherits the job's task count (SLURM_NTASKS), which counts the trainer's nodes too.
    srun --nodes="${#serve_nodes[@]}" --ntasks="$((${#serve_nodes[@]} * replicas_per_node))" \
        --ntasks-per-node="$replicas_per_node" --cpus-per-task="$server_cpus" \
        --nodelist="$(IFS=,; echo "${serve_nodes[*]}")" --export=ALL \
        "${server_container[@]}" bash "$ARENA_SUBMISSION_DIR/train.sbatch" --step policy-server &
    servers_pid=$!
fi
# The FSDP2 worker takes its nodes' CPUs; the loop shares the first of them (--overlap).
worker_pid=""
loop_share=()
if ((trainer_ranks_per_node > 0)); then
    srun --nodes="$trainer_nodes" --ntasks="$trainer_nodes" --ntasks-per-node=1 --cpus-per-task="$node_cpus" \
        --nodelist="$ARENA_TRAINER_NODES" --export=ALL \
        "${worker_container[@]}" bash "$ARENA_SUBMISSION_DIR/train.sbatch" --step fsdp2-worker &
    worker_pid=$!
    loop_share=(--overlap)
fi
srun --nodes=1 --ntasks=1 --cpus-per-task="$node_cpus" --nodelist="$trainer_node" "${loop_share[@]}" \
    --export=ALL "${trainer_container[@]}" bash "$ARENA_SUBMISSION_DIR/train.sbatch" --step trainer &
trainer_pid=$!

stop() {
    for pid in "$@"; do
        kill "$pid" 2>/dev/null || true
    done
}
trap 'stop "$trainer_pid" $worker_pid $servers_pid; wait; exit 143' TERM INT

# Whichever step ends first decides: the trainer's (the loop's) status is the job's; an FSDP2 worker or
# policy servers that end before it fail the job.
wait -n || true
if kill -0 "$trainer_pid" 2>/dev/null; then
    if [[ -n "$worker_pid" ]] && ! kill -0 "$worker_pid" 2>/dev/null; then
        echo "train: the fsdp2 worker ended before the trainer; stopping it" >&2
    else
        echo "train: the policy servers ended before the trainer; stopping it" >&2
    fi
    stop "$trainer_pid" $worker_pid $servers_pid
    wait || true
    exit 1
fi
status=0
wait "$trainer_pid" || status=$?
stop $worker_pid $servers_pid
wait || true
echo "train: the trainer exited with status $status"
exit "$status"
