/* test_srv_load.c - a model's file checked as it is mapped
 * (srv_load_model, srv_load_page_in): the right sha256 passes and a wrong
 * one is refused before the parser reads a byte, naming both digests
 * whole; a file cut short after it was mapped fails the load with a
 * message (SIGBUS caught on the reading thread), the process lives on; a
 * file cut short while its digest is being taken fails the same way and
 * leaves no fd or mapping behind; a
 * file rewritten in place after it was mapped (what was mapped reads the
 * new bytes) is refused by its moved mtime. */
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "llm/mkmodel.h"
#include "srv.h"

static char g_path[64];

static int setup(void **st)
{
    (void)st;
    llm_error err = {0};
    snprintf(g_path, sizeof g_path, "/tmp/test_srv_load_%d.gguf", (int)getpid());
    if (llm_mkmodel(llm_shape_find("tiny"), QT_Q8_0, 5, g_path, &err))
        return -1;
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    unlink(g_path);
    return 0;
}

/* A fresh copy of the model at path (the tests change it). */
static void copy_to(const char *path)
{
    FILE *in = fopen(g_path, "rb"), *out = fopen(path, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

static void sha256_hex(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    assert_true(md && EVP_DigestInit_ex(md, EVP_sha256(), NULL));
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) EVP_DigestUpdate(md, buf, n);
    unsigned char d[32];
    unsigned int dn;
    EVP_DigestFinal_ex(md, d, &dn);
    EVP_MD_CTX_free(md);
    fclose(f);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

/* A fresh copy of the model at g_path.SUFFIX into path, its sha256 into hex. */
static void fresh_copy(const char *suffix, char path[80], char hex[65])
{
    snprintf(path, 80, "%s.%s", g_path, suffix);
    copy_to(path);
    sha256_hex(path, hex);
}

static void test_digest_on_the_mapping(void **st)
{
    (void)st;
    char path[80], hex[65], msg[200];
    fresh_copy("a", path, hex);
    llm_model *m = NULL;
    llm_error err = {0};
    const char *zeros = "0000000000000000000000000000000000000000000000000000000000000000";
    assert_int_equal(srv_load_model(path, zeros, NULL, NULL, NULL, &m, &err), LLM_ERR_FORMAT);
    assert_null(m);
    snprintf(msg, sizeof msg, "sha256 mismatch: the file's is %s, expected %s", hex, zeros);
    assert_non_null(strstr(err.msg, msg));
    /* the check comes before the parse: garbage pinned to a wrong digest says mismatch, not "not a GGUF" */
    char junk[80];
    snprintf(junk, sizeof junk, "%s.junk", g_path);
    FILE *f = fopen(junk, "wb");
    assert_non_null(f);
    fputs("not a model at all", f);
    fclose(f);
    assert_int_equal(srv_load_model(junk, zeros, NULL, NULL, NULL, &m, &err), LLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "sha256 mismatch"));
    unlink(junk);
    assert_int_equal(srv_load_model(path, "ab,cd", NULL, NULL, NULL, &m, &err), LLM_ERR_INVALID_ARG); /* 2 for 1 */
    assert_int_equal(srv_load_model(path, hex, NULL, NULL, NULL, &m, &err), LLM_OK);
    assert_int_equal(srv_load_page_in(m, NULL, NULL, NULL, &err), LLM_OK);
    llm_model_free(m);
    unlink(path);
}

static void test_cut_short_while_mapped(void **st)
{
    (void)st;
    char path[80];
    snprintf(path, sizeof path, "%s.b", g_path);
    copy_to(path);
    assert_int_equal(srv_load_catch_bus(), 0); /* (cmocka sets its own SIGBUS handler for each test) */
    llm_model *m = NULL;
    llm_error err = {0};
    assert_int_equal(srv_load_model(path, NULL, NULL, NULL, NULL, &m, &err), LLM_OK);
    assert_int_equal(truncate(path, 4096), 0); /* another writer cuts it: the pages past 4 KiB are gone */
    assert_int_equal(srv_load_page_in(m, NULL, NULL, NULL, &err), LLM_ERR_IO);
    assert_non_null(strstr(err.msg, "truncated while it was read in (SIGBUS)"));
    llm_model_free(m); /* (its pages past the end are never touched again) */
    unlink(path);
}

/* The open fds and the mappings of path in this process. */
static void held(const char *path, int *fds, int *maps)
{
    *fds = *maps = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) *fds += e->d_name[0] != '.';
    closedir(d);
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4096];
    while (fgets(line, sizeof line, f)) *maps += strstr(line, path) != NULL;
    fclose(f);
}

static int g_cuts;

/* srv_load_model's progress: the first report (after the first MiB was hashed) cuts the file short */
static void cut_at_first_report(void *ctx, double done)
{
    (void)done;
    if (!g_cuts++)
        assert_int_equal(truncate(ctx, 4096), 0);
}

static void test_cut_short_while_checked(void **st)
{
    (void)st;
    char path[80], hex[65];
    fresh_copy("d", path, hex);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true(sb.st_size > (1 << 20) + (64 << 10)); /* (pages past the first MiB are left to fault) */
    assert_int_equal(srv_load_catch_bus(), 0);
    int fds0, maps0, fds, maps;
    held(path, &fds0, &maps0);
    llm_model *m = NULL;
    llm_error err = {0};
    g_cuts = 0;
    assert_int_equal(srv_load_model(path, hex, cut_at_first_report, path, NULL, &m, &err), LLM_ERR_IO);
    assert_null(m);
    assert_non_null(strstr(err.msg, "truncated while it was read in (SIGBUS)"));
    assert_int_equal(g_cuts, 1);
    held(path, &fds, &maps); /* the loader unwound: nothing of the file is still open or mapped */
    assert_int_equal(fds, fds0);
    assert_int_equal(maps, maps0);
    unlink(path);
}

static void test_rewritten_in_place(void **st)
{
    (void)st;
    char path[80], hex[65];
    fresh_copy("c", path, hex);
    llm_model *m = NULL;
    llm_error err = {0};
    assert_int_equal(srv_load_model(path, hex, NULL, NULL, NULL, &m, &err), LLM_OK); /* checked as mapped */
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    unsigned char b = 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, sb.st_size - 1), 1); /* the same size, another last byte */
    struct timespec later[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = sb.st_mtim.tv_sec + 5}};
    assert_int_equal(futimens(fd, later), 0); /* (a coarse clock could give the write the old mtime) */
    close(fd);
    /* what was checked is no longer what is mapped: refused before the engine starts */
    assert_int_equal(srv_load_page_in(m, NULL, NULL, NULL, &err), LLM_ERR_IO);
    assert_non_null(strstr(err.msg, "modified while loaded"));
    llm_model_free(m);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_digest_on_the_mapping),
                                       cmocka_unit_test(test_cut_short_while_mapped),
                                       cmocka_unit_test(test_cut_short_while_checked),
                                       cmocka_unit_test(test_rewritten_in_place)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
