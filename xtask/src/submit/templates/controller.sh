#!/usr/bin/env bash
#SBATCH --job-name={{trial}}-controller
#SBATCH --nodes=1
#SBATCH --ntasks=1
{{controller_resources}}
#SBATCH --time={{controller_time}}
#SBATCH --export=ALL
#SBATCH --chdir={{areal_dir}}
#SBATCH --output={{submission_dir}}/controller-%j.log
{{site_directives}}
#
# The arena-rl controller of trial {{trial}} (profile {{profile}}{{check_note}}).
# Rendered by `cargo xtask submit` on {{host}} at {{timestamp}}; docs/slurm.md explains it.
# It runs the preflight, then submits the GPU job (train.sbatch next to this file) and supervises it.
# It holds no credential: ARENA_CREDENTIALS_FILE is sourced when the job runs.
set -euo pipefail
set +x

# Launch values. They are set again after the credentials file is sourced: explicit launch values win.
launch_values() {
{{launch_values}}
}
launch_values

if [[ "${1:-}" != --run && "$AREAL_CONTAINER_BIN" != none ]]; then
    exec "$AREAL_CONTAINER_BIN" exec --no-eval --pid --writable-tmpfs --bind "$AREAL_CONTROLLER_MOUNTS" \
        "$AREAL_IMAGE" bash "$ARENA_SUBMISSION_DIR/controller.sbatch" --run
fi

cd "$AREAL_DIR"
echo "controller: trial $TRIAL_NAME, profile {{profile}}, on $(hostname)"

# The preflight runs in a subshell, so the credentials stay there: the GPU job is submitted without them and
# its steps source the file themselves.
(
    set -a
    # shellcheck disable=SC1090
    . "$ARENA_CREDENTIALS_FILE"
    set +a
    launch_values
    missing=0
    for name in ARENA_OPENAPI_BASE ARENA_OPENAPI_TOKEN ARENA_LLM_API_KEY SWE_RL_ADMIN_API_KEY; do
        if [[ -z "${!name:-}" ]]; then
            echo "controller: $name is not set; export it from $ARENA_CREDENTIALS_FILE" >&2
            missing=1
        fi
    done
    if [[ $missing != 0 ]]; then
        exit 2
    fi
    unset ALL_PROXY HTTP_PROXY HTTPS_PROXY all_proxy http_proxy https_proxy
{{preflight}}
)
echo "controller: preflight passed: $ARENA_SUBMISSION_DIR/preflight.json"
if [[ -n "$ARENA_CHECK_ONLY" ]]; then
    echo "controller: --check-arena: stopping before training"
    exit 0
fi

# The GPU job must not inherit this job's own Slurm settings (memory, CPUs, node list).
while read -r name; do
    case "$name" in
        SLURM_CONF | SLURM_EXPORT_ENV) ;;
        SLURM_*) unset "$name" ;;
    esac
done < <(compgen -e)
job="$(sbatch --parsable "$ARENA_SUBMISSION_DIR/train.sbatch")"
job="${job%%;*}"
echo "$job" > "$ARENA_SUBMISSION_DIR/train.jobid"
echo "controller: submitted the GPU job $job; its log is $ARENA_SUBMISSION_DIR/train-$job.log"

# Cancelling this controller (or its time limit) cancels the GPU job too.
trap 'echo "controller: stopping: cancelling the GPU job $job" >&2; scancel "$job" || true; exit 143' TERM INT
failures=0
while :; do
    if info="$(scontrol show job -o "$job" 2>/dev/null)"; then
        failures=0
        state="$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")"
        case "$state" in
            PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | REQUEUED | REQUEUE_HOLD | REQUEUE_FED | \
                RESIZING | SIGNALING | STAGE_OUT | RESV_DEL_HOLD) ;;
            *) break ;;
        esac
    else
        state=""
        failures=$((failures + 1))
        if ((failures >= 10)); then
            break
        fi
    fi
    sleep "$ARENA_SUPERVISE_INTERVAL" &
    wait $!
done
echo "controller: the GPU job $job ended: ${state:-UNKNOWN}"
if [[ "$state" != COMPLETED ]]; then
    exit 1
fi
