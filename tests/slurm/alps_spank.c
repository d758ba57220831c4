/*
 * alps_spank.c - test-only SPANK plugin for the single-node Slurm harness (tests/slurm/).
 *
 * It EMULATES OPTION PARSING ONLY. CSCS Alps adds job options through SPANK plugins: the uenv
 * plugin (--uenv=<label>[:<mount>], --view=<view>) and the Container Engine (--environment=<EDF>).
 * A stock Slurm rejects those options, so generated job scripts could not be submitted unchanged.
 * This plugin accepts them for sbatch, salloc and srun and reports, for every job step, what the
 * step asked for. It mounts no uenv, starts no container and changes nothing else in the job.
 *
 * What it does
 *   - registers --uenv, --view and --environment (each takes an argument);
 *   - in srun/sbatch/salloc: rejects an empty value and --view without --uenv (as the uenv plugin
 *     does); options given to sbatch reach the srun calls in the batch script through Slurm's SPANK
 *     environment propagation (SLURM_SPANK__SLURM_SPANK_OPTION_alps_spank_<name>), the way
 *     "#SBATCH --uenv/--view" applies to every srun on Alps;
 *   - in each step (slurmstepd, remote context) sets ALPS_SPANK_UENV, ALPS_SPANK_VIEW and
 *     ALPS_SPANK_ENVIRONMENT in the tasks' environment to the values the step was given, and
 *     unsets those it was not given (so a value cannot leak from the batch step into a step
 *     through the exported environment);
 *   - appends one line per step to the file named by the plugstack.conf argument log=<path>:
 *       job=<id> step=<id|batch> restart=<n> uenv=<v> view=<v> environment=<v> argv0=<cmd>
 *     ("-" stands for an option that was not given).
 *
 * Build: gcc -shared -fPIC -o alps_spank.so alps_spank.c   (headers from libslurm-dev)
 * plugstack.conf: required /path/alps_spank.so log=/path/steps.log
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(alps_spank, 1);

enum { OPT_UENV = 1, OPT_VIEW = 2, OPT_ENVIRONMENT = 3, N_OPTS = 3 };

static const char *const env_names[N_OPTS + 1] = {
    NULL, "ALPS_SPANK_UENV", "ALPS_SPANK_VIEW", "ALPS_SPANK_ENVIRONMENT",
};

/* values seen by the option callbacks in the current process */
static char *values[N_OPTS + 1];
static char log_path[4096];

static int opt_cb(int val, const char *optarg, int remote);

static struct spank_option alps_options[] = {
    {"uenv", "<label>[:<mount>]", "uenv image to mount (Alps uenv plugin; emulated: parse only)",
     1, OPT_UENV, opt_cb},
    {"view", "<view>", "uenv view to load (Alps uenv plugin; emulated: parse only)",
     1, OPT_VIEW, opt_cb},
    {"environment", "<edf>",
     "Container Engine EDF name or path (Alps CE plugin; emulated: parse only)",
     1, OPT_ENVIRONMENT, opt_cb},
    SPANK_OPTIONS_TABLE_END,
};

static int opt_cb(int val, const char *optarg, int remote)
{
    (void)remote;
    if (val < 1 || val > N_OPTS)
        return -1;
    if (optarg == NULL || optarg[0] == '\0') {
        slurm_error("alps_spank: --%s needs a non-empty value", alps_options[val - 1].name);
        return -1;
    }
    free(values[val]);
    values[val] = strdup(optarg);
    return values[val] ? 0 : -1;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    for (int i = 0; i < ac; i++) {
        if (strncmp(av[i], "log=", 4) == 0) {
            snprintf(log_path, sizeof(log_path), "%s", av[i] + 4);
        } else {
            slurm_error("alps_spank: unknown plugstack.conf argument '%s'", av[i]);
            return -1;
        }
    }
    for (struct spank_option *opt = alps_options; opt->name != NULL; opt++) {
        if (spank_option_register(sp, opt) != ESPANK_SUCCESS) {
            slurm_error("alps_spank: cannot register --%s", opt->name);
            return -1;
        }
    }
    return 0;
}

/* srun, sbatch, salloc: after all options (command line, #SBATCH, environment) are parsed */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (spank_remote(sp))
        return 0;
    if (values[OPT_VIEW] != NULL && values[OPT_UENV] == NULL) {
        slurm_error("alps_spank: --view=%s given without --uenv", values[OPT_VIEW]);
        return -1;
    }
    return 0;
}

/* value of option i for this step: the callback's copy, else spank_option_getopt */
static const char *step_value(spank_t sp, int i)
{
    char *arg = NULL;

    if (values[i] != NULL)
        return values[i];
    if (spank_option_getopt(sp, &alps_options[i - 1], &arg) == ESPANK_SUCCESS && arg != NULL &&
        arg[0] != '\0')
        return arg;
    return NULL;
}

static void append_log(spank_t sp, const char *const vals[])
{
    uint32_t job_id = 0, step_id = 0;
    char restart[32] = "0", step[32], argv0[256] = "-", line[8192];
    int argc = 0;
    char **argv = NULL;
    int fd, len;

    if (log_path[0] == '\0')
        return;
    spank_get_item(sp, S_JOB_ID, &job_id);
    spank_get_item(sp, S_JOB_STEPID, &step_id);
    if (spank_getenv(sp, "SLURM_RESTART_COUNT", restart, sizeof(restart)) != ESPANK_SUCCESS)
        snprintf(restart, sizeof(restart), "0");
    if (step_id == SLURM_BATCH_SCRIPT)
        snprintf(step, sizeof(step), "batch");
    else if (step_id == SLURM_EXTERN_CONT)
        snprintf(step, sizeof(step), "extern");
    else
        snprintf(step, sizeof(step), "%u", step_id);
    if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) == ESPANK_SUCCESS && argc > 0 && argv[0])
        snprintf(argv0, sizeof(argv0), "%s", argv[0]);

    len = snprintf(line, sizeof(line), "job=%u step=%s restart=%s uenv=%s view=%s environment=%s "
                   "argv0=%s\n", job_id, step, restart, vals[OPT_UENV] ? vals[OPT_UENV] : "-",
                   vals[OPT_VIEW] ? vals[OPT_VIEW] : "-",
                   vals[OPT_ENVIRONMENT] ? vals[OPT_ENVIRONMENT] : "-", argv0);
    if (len <= 0)
        return;
    if ((size_t)len >= sizeof(line))
        len = sizeof(line) - 1;
    fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        slurm_error("alps_spank: cannot open %s: %s", log_path, strerror(errno));
        return;
    }
    /* one write() with O_APPEND: lines of concurrent steps do not interleave */
    if (write(fd, line, (size_t)len) != len)
        slurm_error("alps_spank: short write to %s", log_path);
    close(fd);
}

/* slurmstepd, once per step, before the tasks are forked: export the values to the tasks */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    const char *vals[N_OPTS + 1] = {NULL};

    (void)ac;
    (void)av;
    if (!spank_remote(sp))
        return 0;
    for (int i = 1; i <= N_OPTS; i++) {
        vals[i] = step_value(sp, i);
        if (vals[i] != NULL)
            spank_setenv(sp, env_names[i], vals[i], 1);
        else
            spank_unsetenv(sp, env_names[i]);
    }
    append_log(sp, vals);
    return 0;
}
