/* Start a task as another user with vfork + exec (local_shim._fork_exec_as).

   CPython's _posixsubprocess never uses vfork when it must switch uid, gid or
   groups, so a shim that starts a task as the job's own user copied its page
   tables in a real fork for every task. glibc's setuid, setgid and setgroups
   are the reason: they change the credentials of every thread of the process
   (a signal to each), and in a vfork child the threads glibc knows are the
   parent's. A raw system call changes only the caller's, which in a vfork
   child is the child alone. So here the child runs nothing but raw system
   calls and async-signal-safe functions, and everything that allocates is
   done before the vfork.

   The child, in this order: its own session; stdin, stdout, stderr and the
   script (on SCRIPT_FD, 3, as posix_spawn gives it) in place; every other fd
   closed; where asked, a mount namespace of its own (below); the working
   directory; the umask; the cgroups joined while still root; no supplementary group; the gid, then the uid, in all three slots
   (real, effective, saved); RLIMIT_FSIZE and RLIMIT_DATA, soft and hard, last (the child's own
   steps must not meet it); every handled signal and the given ones back to
   default; no signal blocked; exec. A step that fails is recorded, with its
   errno, in memory the parent shares (vfork lends the child the parent's
   memory until the exec), and the child exits 127; the parent reaps it and
   raises OSError.

   The mount namespace (local_namespaces): unshare(CLONE_NEWNS); every mount
   made private (nothing mounted here reaches the machine's namespace); a
   fresh proc on /proc with the given options (hidepid=2: other users'
   processes are not there); a tmpfs on /dev/shm and one on /tmp. A working
   directory under /tmp or /dev/shm (`keep`) is opened before either is
   covered, and bound back at its own path inside the new tmpfs, its parents
   made there first (`keep_dirs`). The tmpfs mounts and what they hold go away when the
   namespace's last process exits.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define SCRIPT_FD 3
#define MAX_CGROUPS 4
#define MAX_KEEP_DIRS 64

/* What failed in the child: written by the child, read by the parent once
   vfork returns (the child has exec'd or exited by then). */
struct failure {
    const char *step;
    int error;
};

struct child_plan {
    const char *program;
    char *const *argv;
    char *const *envp;
    const char *cwd;
    int stdio[3];
    int script_fd;  /* -1: none */
    uid_t uid;
    gid_t gid;
    mode_t umask;
    const char *cgroup_procs[MAX_CGROUPS];  /* NULL-terminated */
    char pid_text[24];         /* filled in by the child for cgroup_procs */
    int private_mounts;
    const char *proc_options;
    const char *shm_options;
    const char *tmp_options;
    const char *keep;          /* NULL: none */
    const char *keep_dirs[MAX_KEEP_DIRS];  /* NULL-terminated */
    char keep_source[40];      /* "/proc/self/fd/N", by the child */
    int has_data_limit;
    rlim_t data_limit;
    int has_fsize_limit;
    rlim_t fsize_limit;
    const sigset_t *reset;     /* dispositions set back to default */
    int max_fd;                /* for closing fds without close_range */
};

static void __attribute__((noreturn)) fail(volatile struct failure *failure, const char *step)
{
    failure->step = step;
    failure->error = errno;
    _exit(127);
}

/* Moves `fd` to a number >= `floor`, so that dup2 onto 0..floor-1 cannot
   overwrite it before it is itself put in place. */
static int lift(int fd, int floor)
{
    if (fd < 0 || fd >= floor)
        return fd;
    return fcntl(fd, F_DUPFD_CLOEXEC, floor);
}

static int write_all(int fd, const char *text, size_t length)
{
    while (length > 0) {
        ssize_t written = write(fd, text, length);
        if (written < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        text += written;
        length -= (size_t)written;
    }
    return 0;
}

static void format_pid(char *out, long pid)
{
    char digits[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0);
    while (n > 0)
        *out++ = digits[--n];
    *out = '\0';
}

/* The mount namespace steps (see the top of this file). */
static void enter_private_mounts(struct child_plan *plan, volatile struct failure *failure)
{
    const unsigned long flags = MS_NOSUID | MS_NODEV;
    if (unshare(CLONE_NEWNS) < 0)
        fail(failure, "unshare mount namespace");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        fail(failure, "make mounts private");
    if (mount("proc", "/proc", "proc", flags | MS_NOEXEC, plan->proc_options) < 0)
        fail(failure, "mount /proc");
    int keep = -1;
    if (plan->keep != NULL && (keep = open(plan->keep, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        fail(failure, "open the working directory");
    if (mount("tmpfs", "/dev/shm", "tmpfs", flags, plan->shm_options) < 0)
        fail(failure, "mount /dev/shm");
    if (mount("tmpfs", "/tmp", "tmpfs", flags, plan->tmp_options) < 0)
        fail(failure, "mount /tmp");
    if (keep >= 0) {
        /* 0711 whatever the umask (the shim's is 077): the task's uid must pass
           through to its working directory by its absolute path. */
        for (int i = 0; plan->keep_dirs[i] != NULL; i++)
            if ((mkdir(plan->keep_dirs[i], 0711) < 0 && errno != EEXIST) || chmod(plan->keep_dirs[i], 0711) < 0)
                fail(failure, "mkdir in the new tmpfs");
        memcpy(plan->keep_source, "/proc/self/fd/", 14);
        format_pid(plan->keep_source + 14, keep);
        if (mount(plan->keep_source, plan->keep, NULL, MS_BIND, NULL) < 0)
            fail(failure, "bind the working directory");
        close(keep);
    }
}

/* The vfork child. Never returns: it runs on the parent's stack, whose frames
   the parent still needs. Only raw system calls and async-signal-safe
   functions from here on; no malloc, no Python. */
static void __attribute__((noinline, noreturn))
child_exec(struct child_plan *plan, volatile struct failure *failure)
{
    int first_closed = plan->script_fd >= 0 ? SCRIPT_FD + 1 : SCRIPT_FD;
    int sources[4] = {plan->stdio[0], plan->stdio[1], plan->stdio[2], plan->script_fd};
    int count = plan->script_fd >= 0 ? 4 : 3;

    if (setsid() < 0)
        fail(failure, "setsid");
    for (int i = 0; i < count; i++)
        if ((sources[i] = lift(sources[i], first_closed)) < 0)
            fail(failure, "dup");
    for (int i = 0; i < count; i++)
        if (dup2(sources[i], i) < 0)  /* dup2 clears close-on-exec on the copy */
            fail(failure, "dup2");
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned)first_closed, ~0U, 0) < 0)
#endif
    {
        for (int fd = first_closed; fd < plan->max_fd; fd++)
            close(fd);
    }
    if (plan->private_mounts)
        enter_private_mounts(plan, failure);
    if (chdir(plan->cwd) < 0)
        fail(failure, "chdir");
    umask(plan->umask);
    if (plan->cgroup_procs[0] != NULL)
        format_pid(plan->pid_text, (long)syscall(SYS_getpid));
    for (int i = 0; plan->cgroup_procs[i] != NULL; i++) {
        /* While still root: a process that has dropped to the task's uid may
           no longer move itself. Its own pid, which cgroup v1 and v2 both
           take (glibc no longer caches getpid: this asks the kernel). */
        int procs = open(plan->cgroup_procs[i], O_WRONLY | O_CLOEXEC);
        if (procs < 0)
            fail(failure, "open cgroup.procs");
        if (write_all(procs, plan->pid_text, strlen(plan->pid_text)) < 0)
            fail(failure, "join cgroup");
        close(procs);
    }
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        fail(failure, "setgroups");
    if (syscall(SYS_setresgid, plan->gid, plan->gid, plan->gid) < 0)
        fail(failure, "setresgid");
    if (syscall(SYS_setresuid, plan->uid, plan->uid, plan->uid) < 0)
        fail(failure, "setresuid");
    if (plan->has_fsize_limit) {
        struct rlimit limit = {plan->fsize_limit, plan->fsize_limit};
        if (setrlimit(RLIMIT_FSIZE, &limit) < 0)
            fail(failure, "setrlimit RLIMIT_FSIZE");
    }
    if (plan->has_data_limit) {
        struct rlimit limit = {plan->data_limit, plan->data_limit};
        if (setrlimit(RLIMIT_DATA, &limit) < 0)
            fail(failure, "setrlimit RLIMIT_DATA");
    }
    /* Every signal is blocked (by the parent, before vfork): a handler still
       installed would run the parent's Python machinery in this child if a
       signal came after the unblock and before the exec. */
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction action;
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        if (sigaction(sig, NULL, &action) < 0)
            continue;  /* one glibc keeps for itself */
        if (action.sa_handler == SIG_DFL)
            continue;
        if (action.sa_handler == SIG_IGN && !sigismember(plan->reset, sig))
            continue;  /* an ignored signal the task may keep ignoring */
        action.sa_handler = SIG_DFL;
        action.sa_flags = 0;
        sigemptyset(&action.sa_mask);
        if (sigaction(sig, &action, NULL) < 0)
            fail(failure, "sigaction");
    }
    sigset_t none;
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
        fail(failure, "sigprocmask");
    execve(plan->program, plan->argv, plan->envp);
    fail(failure, "exec");
}

/* A NULL-terminated array of the byte strings of `items` (str via the file
   system encoding), whose bytes objects are kept alive in `keep`. */
static char **string_array(PyObject *items, PyObject *keep, const char *what)
{
    PyObject *sequence = PySequence_Fast(items, what);
    if (sequence == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(sequence);
    char **array = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    if (array == NULL) {
        Py_DECREF(sequence);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *encoded = NULL;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(sequence, i), &encoded))
            goto error;
        int added = PyList_Append(keep, encoded);
        Py_DECREF(encoded);  /* `keep` holds it */
        if (added < 0)
            goto error;
        if (strlen(PyBytes_AS_STRING(encoded)) != (size_t)PyBytes_GET_SIZE(encoded)) {
            PyErr_Format(PyExc_ValueError, "embedded null byte in %s", what);
            goto error;
        }
        array[i] = PyBytes_AS_STRING(encoded);
    }
    Py_DECREF(sequence);
    return array;
error:
    Py_DECREF(sequence);
    PyMem_Free(array);
    return NULL;
}

static const char *kept_path(PyObject *path, PyObject *keep)
{
    PyObject *encoded = NULL;
    if (!PyUnicode_FSConverter(path, &encoded))
        return NULL;
    int added = PyList_Append(keep, encoded);
    Py_DECREF(encoded);
    if (added < 0)
        return NULL;
    if (strlen(PyBytes_AS_STRING(encoded)) != (size_t)PyBytes_GET_SIZE(encoded)) {
        PyErr_SetString(PyExc_ValueError, "embedded null byte in a path");
        return NULL;
    }
    return PyBytes_AS_STRING(encoded);
}

PyDoc_STRVAR(spawn_as_doc,
"spawn_as(program, argv, env, cwd, stdin, stdout, stderr, script_fd, uid, gid,\n"
"         umask, cgroup_procs, data_limit, reset_signals, mounts=None,\n"
"         fsize_limit=None) -> pid\n\n"
"Start `program` as uid:gid with no supplementary group, in a session of its\n"
"own, with vfork + exec. `env`: 'NAME=value' strings. `script_fd` (-1: none)\n"
"reaches the program as fd 3; every other fd but its stdio is closed.\n"
"`cgroup_procs`: cgroup.procs files the child joins while still root (at most\n"
"4). `data_limit` (None: none): its RLIMIT_DATA, soft and hard.\n"
"`reset_signals`: signals set back to default even when ignored (a handled\n"
"one always is). Raises OSError naming the step that failed; the failed child\n"
"has been reaped.\n"
"`mounts` (None: none): (proc_options, shm_options, tmp_options, keep,\n"
"keep_dirs): a mount namespace of the child's own (see the source).\n"
"`fsize_limit` (None: none): its RLIMIT_FSIZE, soft and hard.");

static PyObject *spawn_as(PyObject *module, PyObject *args)
{
    PyObject *program_obj, *argv_obj, *env_obj, *cwd_obj, *cgroup_obj, *limit_obj, *reset_obj;
    PyObject *mounts_obj = Py_None, *fsize_obj = Py_None;
    int stdin_fd, stdout_fd, stderr_fd, script_fd, mask;
    unsigned int uid, gid;
    if (!PyArg_ParseTuple(args, "OOOOiiiiIIiOOO|OO:spawn_as", &program_obj, &argv_obj, &env_obj, &cwd_obj,
                          &stdin_fd, &stdout_fd, &stderr_fd, &script_fd, &uid, &gid, &mask,
                          &cgroup_obj, &limit_obj, &reset_obj, &mounts_obj, &fsize_obj))
        return NULL;

    struct child_plan plan;
    memset(&plan, 0, sizeof plan);
    char **argv = NULL, **envp = NULL;
    PyObject *result = NULL;
    PyObject *keep = PyList_New(0);
    if (keep == NULL)
        return NULL;

    if ((plan.program = kept_path(program_obj, keep)) == NULL)
        goto done;
    if ((plan.cwd = kept_path(cwd_obj, keep)) == NULL)
        goto done;
    if (cgroup_obj != Py_None) {
        PyObject *files = PySequence_Fast(cgroup_obj, "cgroup_procs");
        if (files == NULL)
            goto done;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(files);
        if (n >= MAX_CGROUPS) {
            Py_DECREF(files);
            PyErr_SetString(PyExc_ValueError, "too many cgroup.procs files");
            goto done;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            if ((plan.cgroup_procs[i] = kept_path(PySequence_Fast_GET_ITEM(files, i), keep)) == NULL) {
                Py_DECREF(files);
                goto done;
            }
        Py_DECREF(files);
    }
    if (mounts_obj != Py_None) {
        PyObject *proc_o, *shm_o, *tmp_o, *keep_o, *dirs_o;
        if (!PyArg_ParseTuple(mounts_obj, "OOOOO:mounts", &proc_o, &shm_o, &tmp_o, &keep_o, &dirs_o))
            goto done;
        plan.private_mounts = 1;
        if ((plan.proc_options = kept_path(proc_o, keep)) == NULL
            || (plan.shm_options = kept_path(shm_o, keep)) == NULL
            || (plan.tmp_options = kept_path(tmp_o, keep)) == NULL)
            goto done;
        if (keep_o != Py_None) {
            if ((plan.keep = kept_path(keep_o, keep)) == NULL)
                goto done;
            PyObject *dirs = PySequence_Fast(dirs_o, "keep_dirs");
            if (dirs == NULL)
                goto done;
            Py_ssize_t n = PySequence_Fast_GET_SIZE(dirs);
            if (n >= MAX_KEEP_DIRS) {
                Py_DECREF(dirs);
                PyErr_SetString(PyExc_ValueError, "working directory too deep under /tmp");
                goto done;
            }
            for (Py_ssize_t i = 0; i < n; i++)
                if ((plan.keep_dirs[i] = kept_path(PySequence_Fast_GET_ITEM(dirs, i), keep)) == NULL) {
                    Py_DECREF(dirs);
                    goto done;
                }
            Py_DECREF(dirs);
        }
    }
    if ((argv = string_array(argv_obj, keep, "argv")) == NULL)
        goto done;
    if ((envp = string_array(env_obj, keep, "env")) == NULL)
        goto done;
    if (limit_obj != Py_None) {
        unsigned long long limit = PyLong_AsUnsignedLongLong(limit_obj);
        if (limit == (unsigned long long)-1 && PyErr_Occurred())
            goto done;
        plan.has_data_limit = 1;
        plan.data_limit = (rlim_t)limit;
    }
    if (fsize_obj != Py_None) {
        unsigned long long limit = PyLong_AsUnsignedLongLong(fsize_obj);
        if (limit == (unsigned long long)-1 && PyErr_Occurred())
            goto done;
        plan.has_fsize_limit = 1;
        plan.fsize_limit = (rlim_t)limit;
    }
    sigset_t reset;
    sigemptyset(&reset);
    PyObject *iterator = PyObject_GetIter(reset_obj);
    if (iterator == NULL)
        goto done;
    PyObject *item;
    while ((item = PyIter_Next(iterator)) != NULL) {
        long sig = PyLong_AsLong(item);
        Py_DECREF(item);
        if (sig == -1 && PyErr_Occurred())
            break;
        if (sig < 1 || sig >= NSIG) {
            PyErr_Format(PyExc_ValueError, "signal number %ld out of range", sig);
            break;
        }
        sigaddset(&reset, (int)sig);
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred())
        goto done;

    plan.argv = argv;
    plan.envp = envp;
    plan.stdio[0] = stdin_fd;
    plan.stdio[1] = stdout_fd;
    plan.stdio[2] = stderr_fd;
    plan.script_fd = script_fd;
    plan.uid = (uid_t)uid;
    plan.gid = (gid_t)gid;
    plan.umask = (mode_t)mask;
    plan.reset = &reset;
    long open_max = sysconf(_SC_OPEN_MAX);
    plan.max_fd = open_max > 0 && open_max < (1L << 20) ? (int)open_max : (1 << 20);

    volatile struct failure failure = {NULL, 0};
    sigset_t all, before;
    pid_t pid;
    int saved_errno = 0;
    Py_BEGIN_ALLOW_THREADS
    /* No signal handler may run in the child: it shares our memory. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &before);
    pid = vfork();
    if (pid == 0)
        child_exec(&plan, &failure);
    saved_errno = errno;
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (pid > 0 && failure.step != NULL) {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
    }
    Py_END_ALLOW_THREADS

    if (pid < 0) {
        errno = saved_errno;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (failure.step != NULL) {
        PyObject *message = PyUnicode_FromFormat("%s (%s, as uid %u)", strerror(failure.error),
                                                 failure.step, uid);
        if (message == NULL)
            goto done;
        /* OSError(errno, message, filename): the subclass for the errno
           (FileNotFoundError, PermissionError) as a failed exec would raise. */
        PyObject *error = PyObject_CallFunction(PyExc_OSError, "iOO", failure.error, message, program_obj);
        Py_DECREF(message);
        if (error != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(error), error);
            Py_DECREF(error);
        }
        goto done;
    }
    result = PyLong_FromLong((long)pid);
done:
    PyMem_Free(argv);
    PyMem_Free(envp);
    Py_DECREF(keep);
    return result;
}

static PyMethodDef methods[] = {
    {"spawn_as", spawn_as, METH_VARARGS, spawn_as_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "services.launcher.backends._spawn_as",
    "vfork + exec of a task as another user (see local_shim._fork_exec_as).",
    -1,
    methods,
};

PyMODINIT_FUNC PyInit__spawn_as(void)
{
    PyObject *created = PyModule_Create(&module);
    /* MOUNTS: this build takes cgroup_procs as a list and the mounts argument
       (local_shim refuses an older build left in place). */
    if (created != NULL && (PyModule_AddIntConstant(created, "SCRIPT_FD", SCRIPT_FD) < 0
                            || PyModule_AddIntConstant(created, "MOUNTS", 1) < 0)) {
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
