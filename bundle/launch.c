/*
 * cron-runner's entry point in an app image (the chart's runner.inject): a static program
 * that checks the image can run the bundle, then becomes it with execv, so the runner keeps
 * this process, its PID (1 in a container) and its signals.
 *
 * The bundle (bundle/cron-runner beside this file) links against glibc 2.36 or later
 * (Debian 12). An image without glibc's dynamic loader, musl (Alpine) above all, would
 * otherwise fail with a bare "no such file or directory"; this says why, and exits 78, the
 * runner's configuration error, which fails the Job at once (retrying cannot help).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#define GLIBC_LOADER "/lib64/ld-linux-x86-64.so.2"
#elif defined(__aarch64__)
#define GLIBC_LOADER "/lib/ld-linux-aarch64.so.1"
#else
#error "cron-runner-launch: add this architecture's glibc dynamic loader"
#endif

#define EXIT_CONFIG 78
#define EXIT_CANNOT_RUN 126
#define EXIT_NOT_FOUND 127

static int has_musl_loader(void) {
    DIR *dir = opendir("/lib");
    struct dirent *entry;
    int found = 0;
    if (dir == NULL) return 0;
    while (!found && (entry = readdir(dir)) != NULL)
        found = strncmp(entry->d_name, "ld-musl-", 8) == 0;
    closedir(dir);
    return found;
}

int main(int argc, char **argv) {
    char bundle[PATH_MAX];
    ssize_t n;
    char *slash;
    (void)argc;

    if (access(GLIBC_LOADER, X_OK) != 0) {
        if (has_musl_loader())
            fprintf(stderr, "cron-runner: this image uses musl libc (Alpine?); the injected "
                            "runner needs glibc 2.36 or later (Debian 12, Ubuntu 22.04, RHEL 9 "
                            "and later). Use a glibc-based image, or the runner image itself "
                            "(runner.inject: none).\n");
        else
            fprintf(stderr, "cron-runner: this image has no glibc (%s is missing); the injected "
                            "runner needs glibc 2.36 or later (Debian 12 and later).\n",
                    GLIBC_LOADER);
        return EXIT_CONFIG;
    }
    n = readlink("/proc/self/exe", bundle, sizeof bundle - sizeof "/bundle/cron-runner");
    if (n < 0) {
        fprintf(stderr, "cron-runner: cannot find itself (/proc/self/exe): %s\n", strerror(errno));
        return EXIT_CANNOT_RUN;
    }
    bundle[n] = '\0';
    slash = strrchr(bundle, '/');
    strcpy(slash ? slash : bundle, "/bundle/cron-runner");
    execv(bundle, argv);
    fprintf(stderr, "cron-runner: cannot run %s: %s\n", bundle, strerror(errno));
    return errno == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_RUN;
}
