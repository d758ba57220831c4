#!/bin/bash
{%- set cc = cookiecutter %}
{%- set torchrun = cc.launcher == "torchrun" %}
{%- set ce = cc.env_flavour != "uenv" %}
{%- set who = "${SLURM_NODEID}" if torchrun else "${SLURM_PROCID}" %}
{%- set unit = "node" if torchrun else "rank" %}
{%- set stdlib = cc.workload != "images" %}  {#- the program bake: never used (own == 1) #}
# shellcheck disable=SC2154  # FLAVOUR and srun_args come from the job script that sources this
# The part of the training job that does not depend on the environment: run directory, dataset,
# preflight, training (the package, or your own command after --) and requeue.
# jobs/train_<flavour>.sbatch sets what differs (#SBATCH lines,
# FLAVOUR, the environment's variables, srun_args), then sources this file from the repository
# root. Slurm runs a copy of the job script from its spool directory but this file from the
# repository, when the job starts: a queued job runs the version it starts with, like the package.
# Not a script of its own: sbatch jobs/train_<flavour>.sbatch.

# True for plain words: ASCII letters and digits, spaces, _ . / = : , + @ % - (in the C locale:
# elsewhere a range such as a-z may match more than ASCII), at most 1000 characters.
plain_words() {
    local LC_ALL=C
    [[ -z "${1:1000}" && "$1" =~ ^[A-Za-z0-9_./=:,+@%\ -]*$ ]]
}

# True for a whole number of at most 6 ASCII digits (in the C locale, as above).
small_number() {
    local LC_ALL=C
    [[ "$1" =~ ^[0-9]{1,6}$ ]]
}

# A requeued job appends to its log: one line per start says which start the lines below it are.
echo "== job ${SLURM_JOB_ID} start $((${SLURM_RESTART_COUNT:-0} + 1)) on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ)"

# ---- The job's arguments and settings, all checked here, before anything starts.
{%- if cookiecutter.workload == "program" %}
# What runs: your command after -- (sbatch jobs/train_<flavour>.sbatch -- COMMAND [ARGS...],
# docs/your-program.md).
{%- else %}
# What runs: the package (sbatch jobs/train_<flavour>.sbatch [key=value ...]), or your own
# command after -- (sbatch jobs/train_<flavour>.sbatch -- COMMAND [ARGS...], docs/your-program.md),
# with everything below but the config and the dataset, which are the package's.
{%- endif %}
program=()  # your command and its arguments
own=0       # 1: your command runs, not the package
if [[ "${1:-}" == -- ]]; then
    shift
    if [[ $# -eq 0 ]]; then
        echo "error: no command after --: sbatch jobs/train_${FLAVOUR}.sbatch -- COMMAND [ARGS...]" >&2
        exit 2
    fi
    program=("$@")
    own=1
fi
{%- if cookiecutter.workload == "program" %}
# This repository has no training package (workload=program): a job runs your command only.
if [[ ${own} == 0 ]]; then
    echo "error: this repository runs your own program: sbatch jobs/train_${FLAVOUR}.sbatch -- COMMAND [ARGS...] (docs/your-program.md)" >&2
    exit 2
fi
{%- endif %}
# RESUME_ARGS: words appended to your command on every start of a run that started before (a
# requeue, or the same line submitted again; e.g. "--restart auto" for metatrain). Appended as
# plain words, not through a shell: quotes, $, ; and the like are refused.
resume_args=()
if [[ -n "${RESUME_ARGS:-}" ]]; then
    if [[ ${own} == 0 ]]; then
        echo "error: RESUME_ARGS is for your own command (after --); the package resumes by itself" >&2
        exit 2
    fi
    if ! plain_words "${RESUME_ARGS}"; then
        echo "error: RESUME_ARGS=${RESUME_ARGS@Q}: only letters, digits, spaces and _ . / = : , + @ % - (words, at most 1000 characters)" >&2
        exit 2
    fi
fi
# IN_RUN_DIR=1: your command runs in RUN_DIR, not in the repository root, so that what it
# writes to relative paths stays with the run (run/program.py gives the words that name files of
# the repository as absolute paths, so that the command still finds them).
IN_RUN_DIR="${IN_RUN_DIR:-0}"
if [[ "${IN_RUN_DIR}" != 0 && "${IN_RUN_DIR}" != 1 ]]; then
    echo "error: IN_RUN_DIR=${IN_RUN_DIR@Q}: use IN_RUN_DIR=1 (your command runs in RUN_DIR) or 0" >&2
    exit 2
fi
if [[ "${IN_RUN_DIR}" == 1 && ${own} == 0 ]]; then
    echo "error: IN_RUN_DIR is for your own command (after --); the package writes to RUN_DIR itself" >&2
    exit 2
fi
export IN_RUN_DIR
# MAX_REQUEUES: how often the job may requeue itself. A stop signal or exit status 3 requeues;
# past the limit the job ends failed, so that a program that exits 3 at once cannot loop. 50: a
# run chained at a 24-hour time limit goes on for seven weeks; SLURM_RESTART_COUNT counts.
MAX_REQUEUES="${MAX_REQUEUES:-50}"
if ! small_number "${MAX_REQUEUES}"; then
    echo "error: MAX_REQUEUES=${MAX_REQUEUES@Q}: a number of requeues (0: never requeue)" >&2
    exit 2
fi

# The venv layered on the environment by scripts/setup_venv.sh (torch comes from the environment).
export VENV="${PWD}/.venv-${FLAVOUR}"
if [[ ! -x "${VENV}/bin/python" ]]; then
    echo "error: ${VENV} does not exist: run scripts/setup_venv.sh ${FLAVOUR} first" >&2
    exit 2
fi

# One directory per run holds checkpoints, metrics and the resolved config. The same RUN_NAME
# resumes the same run (a requeued job keeps its name), so the job resumes where it stopped.
RUN_NAME="${RUN_NAME:-${SLURM_JOB_NAME}}"
job_ref="${SLURM_JOB_ID}"  # what the requeue below names
task_args=()               # this array task's overrides (SWEEP)
if [[ -n "${SLURM_ARRAY_TASK_ID:-}" ]]; then
    # A job array: each task is a run of its own, <RUN_NAME>-<task id>.
    if [[ -n "${RUN_DIR:-}" ]]; then
        echo "error: RUN_DIR=${RUN_DIR} would be shared by every task of the array; set RUN_NAME instead" >&2
        exit 2
    fi
    RUN_NAME="${RUN_NAME}-${SLURM_ARRAY_TASK_ID}"
    # Requeue names the task: the array's id stands for all of its tasks (and one task runs
    # with SLURM_JOB_ID equal to it), so requeueing that id would restart every task.
    job_ref="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
    if [[ -n "${SWEEP:-}" ]]; then
        if [[ ! -f "${SWEEP}" ]]; then
            echo "error: SWEEP=${SWEEP} does not exist (a path relative to the repository root)" >&2
            exit 2
        fi
        sweep_line="$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "${SWEEP}")"
        if [[ -z "${sweep_line//[[:space:]]/}" ]]; then
            echo "error: SWEEP=${SWEEP} has no line $((SLURM_ARRAY_TASK_ID + 1)) for array task ${SLURM_ARRAY_TASK_ID} (one line of key=value overrides per task)" >&2
            exit 2
        fi
        read -r -a task_args <<< "${sweep_line}"
        echo "array task ${SLURM_ARRAY_TASK_ID}: ${task_args[*]}"
    fi
elif [[ -n "${SWEEP:-}" ]]; then
    echo "error: SWEEP=${SWEEP} needs a job array: sbatch --array=0-N ..." >&2
    exit 2
fi
# shellcheck source=scripts/dirs.sh
source scripts/dirs.sh  # data_root, runs_root: the project's directories
RUN_DIR="${RUN_DIR:-$(runs_root)/${RUN_NAME}}"
# run/program.py leaves STARTED when your command first starts in RUN_DIR: from then on every
# start of this run (a requeue, the same line submitted again after a cancel or a node failure)
# appends RESUME_ARGS; a new run's first start never does.
if [[ -n "${RESUME_ARGS:-}" && -f "${RUN_DIR}/STARTED" ]]; then
    read -r -a resume_args <<< "${RESUME_ARGS}"
    echo "this run started before (${RUN_DIR}/STARTED): RESUME_ARGS appended: ${resume_args[*]}"
fi
{%- if stdlib %}
# Datasets live in DATA_DIR; your own: python -m {{ cc.package_name }} make-dataset --text FILE...
# --out <DATA_DIR>/NAME. Which one trains: DATASET=... in the job's environment, else the config
# file's `dataset`, else the jobs' default, the Python standard library's sources as byte tokens
# (DATA_DIR/stdlib-bytes, made on first use: it needs no download). The run's first lines say
# where each setting came from.
{%- elif cc.workload != "program" %}
# Datasets live in DATA_DIR; your own: python -m {{ cc.package_name }} make-dataset --images DIR
# --out <DATA_DIR>/NAME. Which one trains: DATASET=... in the job's environment, else the config
# file's `dataset`, else synthetic images (the package's default: a first job that measures the
# speed). The run's first lines say where each setting came from.
{%- endif %}
{%- if ce %}
# A container job's EDF mounts DATA_DIR into the container: keep your datasets inside it.
{%- endif %}
DATA_DIR="${DATA_DIR:-$(data_root)}"
if [[ -n "${DATASET:-}" ]]; then
    dataset_args=("dataset=${DATASET}")
    echo "dataset=${DATASET}: from DATASET in the job's environment (over the config file's)"
else
{%- if stdlib %}
    DATASET="${DATA_DIR}/stdlib-bytes"
    dataset_args=(--job-default "dataset=${DATASET}")  # below every config file's value
{%- else %}
    DATASET=synthetic  # the config file's, else the package's default
    dataset_args=()
{%- endif %}
fi
CONFIG="${CONFIG:-configs/default.toml}"
if [[ ${own} == 0 && ! -f "${CONFIG}" ]]; then
    echo "error: CONFIG=${CONFIG} does not exist (a path relative to the repository root)" >&2
    exit 2
fi
export RUN_DIR DATA_DIR
mkdir -p "${RUN_DIR}" "${DATA_DIR}"{% if ce %}  # a container's EDF mounts both: mount sources must exist{% endif %}

# Rendezvous: the first node of the allocation, a port derived from the job id so that two jobs
# sharing a node do not collide. Computed here because scontrol is often missing in containers.
MASTER_ADDR="$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)"
MASTER_PORT="$((15000 + SLURM_JOB_ID % 15000))"  # below the ephemeral range (32768+), as the package does
export MASTER_ADDR MASTER_PORT

# Since Slurm 22.05 srun does not inherit --cpus-per-task from sbatch: pass it on explicitly.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK}"
# CPU threads per rank: the package sets them from SLURM_CPUS_PER_TASK (config key cpu_threads).
# CSCS's PyTorch guide: on a NCCL error or watchdog timeout abort the communicators and end the
# process, so a failed collective ends the job instead of hanging (set here only, for every job script).
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export MPICH_GPU_SUPPORT_ENABLED=0        # GPU-aware Cray MPICH next to NCCL can deadlock; some clusters default to 1
export PYTHONUNBUFFERED=1
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"   # NCCL_DEBUG=INFO sbatch ... should print "Using network AWS Libfabric"

{%- if stdlib %}

# One task runs `python -m {{ cc.package_name }} ARGS` in the venv (the venv is activated inside srun).
# shellcheck disable=SC2016  # expanded by each task's bash, not here
one_task='source "${VENV}/bin/activate" && exec python -m {{ cc.package_name }} "$@"'
{%- endif %}
{%- if torchrun %}
# torchrun forwards these signals to its workers (torch >= 2.9, its --signals-to-handle option,
# read from PET_SIGNALS_TO_HANDLE; TORCHELASTIC_SIGNALS_TO_HANDLE is overwritten by the launcher).
# Older torchrun ignores it and dies on USR2, keeping only the periodic checkpoints: use the
# srun launcher there. torchrun runs through {{ cc.package_name }}/run/torchrun.py, which turns the
# SignalException torchrun raises after forwarding into one line; the REQUEUE marker below is what
# says the checkpoint was written.
export PET_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2,SIGUSR1"
# torchrun's workers per node: one per GPU; on a node without GPUs, one per task asked for
# (sbatch --ntasks-per-node=N, or --ntasks: the first node's count). srun then starts one
# torchrun per node, with the CPUs of all those tasks.
tasks_per_node="${SLURM_TASKS_PER_NODE:-1}"
tasks_per_node="${tasks_per_node%%[(,]*}"
if [[ "${SLURM_GPUS_ON_NODE:-0}" =~ ^[1-9][0-9]*$ ]]; then
    WORKERS_PER_NODE="${SLURM_GPUS_ON_NODE}"
    echo "torchrun: ${WORKERS_PER_NODE} worker(s) per node, one per GPU"
else
    WORKERS_PER_NODE="${tasks_per_node}"
    echo "torchrun: ${WORKERS_PER_NODE} worker(s) per node, one per task asked for (no GPUs)"
fi
export WORKERS_PER_NODE
srun_args+=(--ntasks="${SLURM_NNODES}" --ntasks-per-node=1)
SRUN_CPUS_PER_TASK="$((SLURM_CPUS_PER_TASK * tasks_per_node))"
# All ranks: one torchrun per node starts one worker per GPU; the rendezvous is static, as in
# the CSCS guides: node 0's address and the job's port. exec hands the signals from Slurm to
# torchrun directly.
# shellcheck disable=SC2016  # expanded by each task's bash, not here
rendezvous='--nnodes="${SLURM_NNODES}" --nproc-per-node="${WORKERS_PER_NODE}" \
    --node-rank="${SLURM_NODEID}" --master-addr="${MASTER_ADDR}" --master-port="${MASTER_PORT}"'
# shellcheck disable=SC2016  # expanded by each task's bash, not here
all_ranks='source "${VENV}/bin/activate" && exec "${profile[@]}" python -m {{ cc.package_name }}.run.torchrun '"${rendezvous}"' \
    -m {{ cc.package_name }} "$@"'
# Your command: on each node {{ cc.package_name }}/run/program.py (the rank 0 LOCK, the stop signal
# passed on and noted) runs torchrun with the same rendezvous, which runs the command.
# shellcheck disable=SC2016  # expanded by each task's bash, not here
program_ranks='source "${VENV}/bin/activate" && exec "${profile[@]}" python -m {{ cc.package_name }}.run.program \
    --torchrun '"${rendezvous}"' -- "$@"'
{%- else %}
# All ranks: each task maps SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID to rank/world size/local
# rank in {{ cc.package_name }}/distributed.py; exec lets the preemption signal reach Python rather
# than a wrapper shell.
# shellcheck disable=SC2016  # expanded by each task's bash, not here
all_ranks='source "${VENV}/bin/activate" && exec "${profile[@]}" python -m {{ cc.package_name }} "$@"'
# Your command: each task runs it through {{ cc.package_name }}/run/program.py, which exports RANK,
# LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE (torch.distributed's env://), holds the rank 0
# LOCK, and passes the stop signal on to the command and notes it (for the requeue below).
# shellcheck disable=SC2016  # expanded by each task's bash, not here
program_ranks='source "${VENV}/bin/activate" && exec "${profile[@]}" python -m {{ cc.package_name }}.run.program -- "$@"'
{%- endif %}

# NSYS=1 profiles the training step of {% if torchrun %}node 0 (its torchrun and the workers it starts){% else %}rank 0{% endif %} with Nsight Systems, NSYS=all of every
# {{ unit }}: CSCS profiles by wrapping the program in `nsys profile` (nsys comes with CUDA: NGC
# images, uenvs with a CUDA compiler). One report per profiled {{ unit }} in <RUN_DIR>/nsys/; open it
# in the Nsight Systems GUI (nsys-ui) or summarise it with `nsys stats`. Meant for short runs.
NSYS="${NSYS:-0}"
case "${NSYS}" in
    0 | 1 | all) ;;
    *)
        echo "error: NSYS=${NSYS}: use NSYS=1 ({{ unit }} 0) or NSYS=all (every {{ unit }})" >&2
        exit 2
        ;;
esac
export NSYS NSYS_DIR="${RUN_DIR}/nsys"
[[ "${NSYS}" == 0 ]] || mkdir -p "${NSYS_DIR}"
# shellcheck disable=SC2016  # expanded by each task's bash, not here
profiler='profile=(); if [[ "${NSYS}" == all || ( "${NSYS}" == 1 && "{{ who }}" == 0 ) ]]; then
    command -v nsys >/dev/null || { echo "error: NSYS=${NSYS}: nsys is not in the job environment" >&2; exit 2; }
    profile=(nsys profile --trace=cuda,nvtx,osrt --output="${NSYS_DIR}/${SLURM_JOB_ID}-{{ unit }}{{ who }}"); fi; '

{%- if stdlib %}

# The dataset, once: make-dataset writes to a temporary directory and renames it, so jobs that
# start together cannot leave a half-written one. Only the default stdlib-bytes is made here (also
# when your config file names another: a job script cannot read TOML; it takes a minute, once): a
# missing dataset of yours is an error, not silently replaced.
if [[ ${own} == 0 && "${DATASET}" != synthetic && ! -f "${DATASET}/index.json" ]]; then
    if [[ "$(basename "${DATASET}")" != stdlib-bytes ]]; then
        echo "error: DATASET=${DATASET} has no index.json: make it with python -m {{ cc.package_name }} make-dataset" >&2
        exit 2
    fi
    echo "making the dataset ${DATASET} (the Python standard library as byte tokens)"
    srun "${srun_args[@]}" --nodes=1 --ntasks=1 bash -c "${one_task}" bash \
        make-dataset --stdlib --out "${DATASET}"
fi
{%- else %}

# A missing dataset of yours is an error before any step starts.
if [[ ${own} == 0 && "${DATASET}" != synthetic && ! -f "${DATASET}/index.json" ]]; then
    echo "error: DATASET=${DATASET} has no index.json: make it with python -m {{ cc.package_name }} make-dataset --images DIR --out ${DATASET}" >&2
    exit 2
fi
{%- endif %}

# Your command: that it is there and that no other job holds RUN_DIR, on one task (cheap, before
# the doctor's minute).
if [[ ${own} == 1 && "${DOCTOR:-1}" != 0 ]]; then
    # shellcheck disable=SC2016  # expanded by the task's bash, not here
    check_task='source "${VENV}/bin/activate" && exec python -m {{ cc.package_name }}.run.program --check -- "$@"'
    srun "${srun_args[@]}" --nodes=1 --ntasks=1 bash -c "${check_task}" bash "${program[@]}"
fi

# Preflight on every rank, in the environment training uses: GPUs, NCCL network plugin, CPU
# binding, directories, then a short all-reduce. A FAIL stops the job before it spends its hours.
if [[ "${DOCTOR:-1}" != 0 ]]; then
    read -r -a doctor_args <<< "${DOCTOR_ARGS:-}"  # extra options, e.g. DOCTOR_ARGS="--device cpu"
    doctor_status=0
    srun "${srun_args[@]}" bash -c "profile=(); ${all_ranks}" bash doctor --quick \
        "run_dir=${RUN_DIR}" "data_dir=${DATA_DIR}" "${doctor_args[@]}" || doctor_status=$?
    if [[ ${doctor_status} -eq 2 ]]; then  # the doctor's usage error, not a FAIL
        echo "error: DOCTOR_ARGS=\"${DOCTOR_ARGS:-}\" refused by the doctor (its line above)" >&2
        exit 2
    elif [[ ${doctor_status} -ne 0 ]]; then
        echo "error: the doctor found a problem (the FAIL lines above); nothing was trained." \
            "Fix it, or submit with DOCTOR=0 to skip the check." >&2
        exit 1
    fi
fi

started="$(mktemp)"  # the REQUEUE marker counts only if written after this (see below)
trap 'rm -f "${started}"' EXIT
# The stop signal may come to the batch shell rather than to the step (#SBATCH --signal=B:USR2@T,
# scancel --batch --signal=USR2, preemption's SIGTERM): passed on to srun, which passes it on to
# every task, so that both forms stop, save and requeue alike.
signals_passed=0  # how many stop signals reached this shell
terminated=0      # 1: SIGTERM came (scancel, or preemption: Slurm requeues a preempted job itself)
step_pid=""
# shellcheck disable=SC2329  # invoked by the traps below
pass_on() {
    signals_passed=$((signals_passed + 1))
    [[ "$1" != TERM ]] || terminated=1
    echo "SIG$1 reached the batch shell: passed on to the step"
    [[ -z "${step_pid}" ]] || kill -s "$1" "${step_pid}" 2>/dev/null || true
}
trap 'pass_on USR2' USR2
trap 'pass_on USR1' USR1
trap 'pass_on TERM' TERM
if [[ ${own} == 1 ]]; then
    # Your command, from the repository root; a SWEEP line's words and, on a later start of the
    # run, RESUME_ARGS follow its arguments. RUN_DIR is yours to write to, DATA_DIR holds the data.
    printf -v shown ' %q' "${program[@]}" "${task_args[@]}" "${resume_args[@]}"
    echo "your command:${shown}"
    [[ "${IN_RUN_DIR}" == 0 ]] || echo "it runs in ${RUN_DIR} (IN_RUN_DIR=1)"
    srun "${srun_args[@]}" bash -c "${profiler}${program_ranks}" bash \
        "${program[@]}" "${task_args[@]}" "${resume_args[@]}" &
else
    srun "${srun_args[@]}" bash -c "${profiler}${all_ranks}" bash \
        --config "${CONFIG}" "run_dir=${RUN_DIR}" "${dataset_args[@]}" "$@" "${task_args[@]}" &
fi
step_pid=$!
# wait returns early (status > 128) when a trapped signal arrives: wait again until srun ended
while :; do
    passed_before=${signals_passed}
    status=0
    wait "${step_pid}" || status=$?
    [[ ${status} -gt 128 && ${signals_passed} != "${passed_before}" ]] || break
    kill -0 "${step_pid}" 2>/dev/null || { status=0; wait "${step_pid}" || status=$?; break; }
done

# Exit status 3 (or the REQUEUE marker, which rank 0 writes as it saves: the step's status may be
# another task's, say one that srun's --kill-on-bad-exit ended) means: the run saved a checkpoint
# because of the time limit or a preemption signal. Requeue keeps the job id, and the next start resumes from that checkpoint. An older marker is not this job's
# (a job refused by another one's LOCK must not requeue itself on that job's marker).
# Your command: run/program.py leaves the marker when the command ended because of the time
# limit's warning (killed by it, or exit status 3 after saving), and its tasks exit 0: a task
# that failed (status not 0) is a failure, whatever another task's marker says.
requeue=0
if [[ ${own} == 0 && ( ${status} -eq 3 || "${RUN_DIR}/REQUEUE" -nt "${started}" ) ]]; then
    requeue=1
elif [[ ${own} == 1 && ${status} -eq 0 && "${RUN_DIR}/REQUEUE" -nt "${started}" ]]; then
    requeue=1
fi
if [[ ${requeue} == 1 && ${terminated} == 1 ]]; then
    # scancel must not bring the job back; with PreemptMode=REQUEUE Slurm requeues it itself
    echo "stopped by SIGTERM (scancel, or a preemption that Slurm requeues by itself): not" \
        "requeued by this script; the next start of this run resumes"
    exit 0
fi
if [[ ${requeue} == 1 ]]; then
    what="checkpoint saved after a stop request"
    # the REQUEUE marker's line names the cause: the signal that arrived, or exit status 3
    [[ ${own} == 0 ]] || what="your command $(head -c 300 "${RUN_DIR}/REQUEUE" | head -n 1)"
    restarts="${SLURM_RESTART_COUNT:-0}"
    if [[ ${restarts} -ge ${MAX_REQUEUES} ]]; then
        echo "error: ${what}, but not requeued: job ${job_ref} was requeued ${restarts} times," \
            "MAX_REQUEUES=${MAX_REQUEUES} (submit with a higher MAX_REQUEUES to go on)" >&2
        exit 1
    fi
    echo "${what}: requeueing job ${job_ref} (requeue $((restarts + 1)) of at most" \
        "MAX_REQUEUES=${MAX_REQUEUES}; Slurm starts it again after about two minutes)"
    scontrol requeue "${job_ref}"
    exit 0
fi
if [[ ${status} -ne 0 && ${own} == 1 ]]; then
    # The first task that failed on its own (run/program.py's FAILED-task<N>: the time it ended
    # and its status): srun reports the highest status, often that of a task it killed after.
    first=""
    for failed in "${RUN_DIR}"/FAILED-task*; do
        [[ -f "${failed}" && "${failed}" -nt "${started}" ]] || continue
        read -r when task_status < "${failed}" || continue
        if [[ -z "${first}" || "${when}" -lt "${first%% *}" ]]; then
            first="${when} ${task_status} ${failed##*FAILED-task}"
        fi
    done
    if [[ -n "${first}" ]]; then
        read -r _ status task <<< "${first}"
        echo "error: your command failed on task ${task} (exit status ${status}; its lines above" \
            "say why). Not requeued." >&2
    else
        echo "error: your command failed (exit status ${status}; its lines above say why). Not requeued." >&2
    fi
    exit "${status}"
elif [[ ${status} -eq 4 ]]; then
    echo "error: training diverged (exit status 4: a NaN or inf loss or gradient norm; the ERROR" \
        "line above names the step and the last good checkpoint). Not requeued." >&2
elif [[ ${status} -ne 0 ]]; then
    echo "error: training failed (exit status ${status}; the first ERROR lines above say why:" \
        "a Python error, or a collective that timed out after dist_timeout_s because a rank hung)." \
        "Not requeued." >&2
fi
exit "${status}"
