/* LD_PRELOAD shim for recording goldens from llama.cpp 0c1e570's tools (compat/compare_cli.py loads it).
 *
 * Why: since 0c1e570 common_log_main() leaks its logger on purpose (llama.cpp issue 22142), so nothing joins the
 * logger's worker thread at exit; llama-completion returns from main without common_log_flush() (which log.h asks
 * callers to do), and whatever the worker has not yet printed is lost when exit() ends the process. Under load that
 * is the tail of stdout, up to all of it. b8462's logger destructor paused the worker, which drains its queue first.
 *
 * This does the same at exit: common_log_pause(common_log_main()). Those functions live in the executable's static
 * common library and are not exported, so the caller passes their offsets (from `nm`) in LLAMACMP_LOG_PAUSE as
 * "MAIN_HEX:PAUSE_HEX"; the executable's load address comes from dl_iterate_phdr (its first entry).
 * The output's bytes are the tool's own; only when they are written changes.
 */
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int first_object(struct dl_phdr_info *info, size_t size, void *base) {
    (void) size;
    *(uintptr_t *) base = info->dlpi_addr;
    return 1;  /* the first entry is the executable */
}

__attribute__((destructor)) static void drain_llama_log(void) {
    const char *spec = getenv("LLAMACMP_LOG_PAUSE");
    unsigned long main_off, pause_off;
    if (!spec || sscanf(spec, "%lx:%lx", &main_off, &pause_off) != 2) {
        return;
    }
    uintptr_t base = 0;
    dl_iterate_phdr(first_object, &base);
    void *(*log_main)(void) = (void *(*)(void)) (base + main_off);
    void (*log_pause)(void *) = (void (*)(void *)) (base + pause_off);
    log_pause(log_main());
}
