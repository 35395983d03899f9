/*
 * cron-runner's entry point in an app image (the chart's runner.inject), and in the runner
 * tarball for servers: a static program that becomes the bundle beside it with execv, so
 * the runner keeps this process, its PID (1 in a container) and its signals.
 *
 * The bundle carries its own C library and dynamic loader (bundle/_internal), so it runs in
 * any Linux image whatever its libc: an older glibc, musl (Alpine), or none at all (scratch,
 * distroless static). The image's own loader is never used: this execs the bundled one,
 * which loads the bundle's program with the bundle's libraries (--library-path) and names it
 * by its own path (--argv0): through a loader /proc/self/exe is the loader, and the bundle
 * finds its files from argv[0]. The bundle then sets LD_LIBRARY_PATH for itself and restarts
 * once through the same loader (exec again, same PID); the runner takes that variable out
 * of what the commands it starts inherit (runner/bundle.py).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#define LOADER "ld-linux-x86-64.so.2"
#elif defined(__aarch64__)
#define LOADER "ld-linux-aarch64.so.1"
#else
#error "cron-runner-launch: add this architecture's glibc dynamic loader"
#endif

#define EXIT_CANNOT_RUN 126
#define EXIT_NOT_FOUND 127
#define FIXED_ARGS 6 /* loader --library-path DIR --argv0 NAME PROGRAM */

static char dir[PATH_MAX], program[PATH_MAX], libs[PATH_MAX], loader[PATH_MAX];

static int join(char *out, const char *tail) {
    return snprintf(out, PATH_MAX, "%s%s", dir, tail) >= PATH_MAX;
}

int main(int argc, char **argv) {
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    char *slash, **args;
    int i;

    if (n < 0) {
        fprintf(stderr, "cron-runner: cannot find itself (/proc/self/exe): %s\n", strerror(errno));
        return EXIT_CANNOT_RUN;
    }
    dir[n] = '\0';
    slash = strrchr(dir, '/');
    if (slash != NULL) *slash = '\0';
    if (join(program, "/bundle/cron-runner") || join(libs, "/bundle/_internal") ||
        join(loader, "/bundle/_internal/" LOADER)) {
        fprintf(stderr, "cron-runner: its path is too long: %s\n", dir);
        return EXIT_CANNOT_RUN;
    }
    args = calloc((size_t)argc + FIXED_ARGS, sizeof *args);
    if (args == NULL) {
        fprintf(stderr, "cron-runner: out of memory\n");
        return EXIT_CANNOT_RUN;
    }
    args[0] = loader;
    args[1] = "--library-path";
    args[2] = libs;
    args[3] = "--argv0";
    args[4] = program;
    args[5] = program;
    for (i = 1; i < argc; i++) args[FIXED_ARGS - 1 + i] = argv[i];
    execv(loader, args);
    fprintf(stderr, "cron-runner: cannot run %s: %s\n", loader, strerror(errno));
    return errno == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_RUN;
}
