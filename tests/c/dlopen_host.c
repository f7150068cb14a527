/* Loads a plugin with dlopen() and runs its plugin_main(): libvipl reached
 * the way an MPI device or a language binding reaches it, loaded at run
 * time as a dependency of the plugin rather than with the program. Its
 * thread-local storage is then set up by dlopen(), not at start-up (see
 * .cargo/config.toml: the library reads it through TLS descriptors).
 *
 *   dlopen_host PLUGIN.so
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    void *h;
    int (*plugin_main)(void);

    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGIN.so\n", argv[0]);
        return 2;
    }
    h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    /* POSIX: a data pointer that dlsym returns converts to a function
     * pointer through its representation (ISO C has no such cast). */
    *(void **)(&plugin_main) = dlsym(h, "plugin_main");
    if (plugin_main == NULL) {
        fprintf(stderr, "dlsym plugin_main: %s\n", dlerror());
        return 1;
    }
    return plugin_main();
}
