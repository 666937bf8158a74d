/* Authorisation: allow lists (parsing, names, who passes by uid, primary gid
 * or supplementary group), the messages a refused peer gets, the
 * /proc/<pid>/status parser and the reading of a real process's groups
 * through its pidfd, the request handlers' checks, which load paths are
 * accepted (symbolic links to regular files, directories) and refused
 * (FIFOs, devices), and giving slabs to the socket directory's group. */
#include "auth.h"
#include "auth_files.h"
#include "auth_groups.h"
#include "broker_fixture.h"
#include "loader.h"
#include "ops.h"
#include "wire.h"

#include <check.h>

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static broker_fixture F;

static void setup(void)
{
    fixture_open(&F, "auth");
}

static void teardown(void)
{
    fixture_close(&F);
}

static Wbproto__Reply *hello(const wb_peer_creds *peer)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__HelloRequest h = WBPROTO__HELLO_REQUEST__INIT;
    h.client = "test";
    req.body_case = WBPROTO__REQUEST__BODY_HELLO;
    req.hello = &h;
    return fixture_send(&F, peer, &req);
}

static Wbproto__Reply *list_models(const wb_peer_creds *peer)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__ListModelsRequest lm = WBPROTO__LIST_MODELS_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_MODELS;
    req.list_models = &lm;
    return fixture_send(&F, peer, &req);
}

static Wbproto__Reply *acquire(const wb_peer_creds *peer, const char *model)
{
    return fixture_acquire(&F, peer, model);
}

static Wbproto__Reply *load(const wb_peer_creds *peer, const char *name, const char *path)
{
    return fixture_load(&F, peer, name, path);
}

static Wbproto__Reply *unload(const wb_peer_creds *peer, const char *name)
{
    return fixture_unload(&F, peer, name);
}

/* A uid that is neither root nor ours. */
static uint32_t stranger_uid(void)
{
    return geteuid() == 4321 ? 4322 : 4321;
}

/* Writes a small valid safetensors file with one U8 tensor of 4 bytes. */
static void write_tensor(const char *path, const char *tensor)
{
    char header[128];
    snprintf(header, sizeof header,
             "{\"%s\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", tensor);
    uint64_t n = strlen(header);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, n, f);
    fwrite("\x01\x02\x03\x04", 1, 4, f);
    fclose(f);
}

static void write_model(const char *path)
{
    write_tensor(path, "w");
}

static void write_text(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    ck_assert_int_eq(chmod(path, mode), 0);
}

START_TEST(lists_parse_numbers_and_names)
{
    wb_auth a;
    wb_err err;
    wb__auth_init_default(&a, 1000);
    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_CLIENT_UIDS, "7,3,7", "--allow-uid", &err), WB_OK);
    ck_assert_uint_eq(a.lists[WB_AUTH_CLIENT_UIDS].n, 2);
    ck_assert_uint_eq(a.lists[WB_AUTH_CLIENT_UIDS].ids[0], 3);
    ck_assert_uint_eq(a.lists[WB_AUTH_CLIENT_UIDS].ids[1], 7);

    /* Names resolve through the system's user and group databases. */
    struct passwd *pw = getpwuid(0);
    ck_assert_ptr_nonnull(pw);
    char rootname[64];
    snprintf(rootname, sizeof rootname, "%s", pw->pw_name);
    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_ADMIN_UIDS, rootname, "--admin-uid", &err), WB_OK);
    ck_assert_uint_eq(a.lists[WB_AUTH_ADMIN_UIDS].n, 1);
    ck_assert_uint_eq(a.lists[WB_AUTH_ADMIN_UIDS].ids[0], 0);
    struct group *gr = getgrgid(0);
    ck_assert_ptr_nonnull(gr);
    char groupname[64];
    snprintf(groupname, sizeof groupname, "%s", gr->gr_name);
    char list[100];
    snprintf(list, sizeof list, "%s,27", groupname);
    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_CLIENT_GIDS, list, "--allow-gid", &err), WB_OK);
    ck_assert_uint_eq(a.lists[WB_AUTH_CLIENT_GIDS].n, 2);

    /* Bad entries are refused by name and change nothing. */
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"", "--allow-uid: the list is empty"},
        {"1,,2", "--allow-uid: empty entry in '1,,2'"},
        {"5,", "--allow-uid: empty entry in '5,'"},
        {"12x", "--allow-uid: '12x' is not a user id (0 to 4294967294)"},
        {"4294967295", "--allow-uid: '4294967295' is not a user id (0 to 4294967294)"},
        {"99999999999", "--allow-uid: '99999999999' is not a user id (0 to 4294967294)"},
        {"9,no-such-user-wbtest", "--allow-uid: no user named 'no-such-user-wbtest'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_CLIENT_UIDS, bad[i].text, "--allow-uid", &err),
                         WB_EINVAL);
        ck_assert_str_eq(err.msg, bad[i].want);
        ck_assert_uint_eq(a.lists[WB_AUTH_CLIENT_UIDS].n, 2);
    }
    ck_assert_int_eq(
        wb__auth_add(&a, WB_AUTH_ADMIN_GIDS, "no-such-group-wbtest", "--admin-gid", &err),
        WB_EINVAL);
    ck_assert_str_eq(err.msg, "--admin-gid: no group named 'no-such-group-wbtest'");
    wb__auth_destroy(&a);
}
END_TEST

/* The checks by uid and primary gid alone (no supplementary groups read). */
static int client_ok(const wb_auth *a, uint32_t uid, uint32_t gid)
{
    wb_peer_creds p = creds(uid, gid, 1);
    return wb__auth_client_ok(a, &p);
}

static int admin_ok(const wb_auth *a, uint32_t uid, uint32_t gid)
{
    wb_peer_creds p = creds(uid, gid, 1);
    return wb__auth_admin_ok(a, &p);
}

START_TEST(who_passes)
{
    wb_auth a;
    wb_err err;
    /* The daemon's default: root and the broker's own user, nobody else. */
    wb__auth_init_default(&a, 1000);
    ck_assert(client_ok(&a, 0, 5));
    ck_assert(client_ok(&a, 1000, 5));
    ck_assert(!client_ok(&a, 1001, 1000));
    ck_assert(admin_ok(&a, 1000, 5));
    ck_assert(!admin_ok(&a, 1001, 5));

    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_CLIENT_UIDS, "1001", "--allow-uid", &err), WB_OK);
    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_CLIENT_GIDS, "50", "--allow-gid", &err), WB_OK);
    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_ADMIN_GIDS, "60", "--admin-gid", &err), WB_OK);
    ck_assert(client_ok(&a, 1001, 1));
    ck_assert(!admin_ok(&a, 1001, 1));
    ck_assert(client_ok(&a, 2000, 50));
    ck_assert(!admin_ok(&a, 2000, 50));
    /* An administrator is a client too. */
    ck_assert(client_ok(&a, 3000, 60));
    ck_assert(admin_ok(&a, 3000, 60));
    ck_assert(!client_ok(&a, 3000, 61));

    char buf[128];
    ck_assert_str_eq(wb__auth_describe_clients(&a, buf, sizeof buf),
                     "uid 0, 1000, 1001; gid 50, 60");
    ck_assert_str_eq(wb__auth_describe_admins(&a, buf, sizeof buf), "uid 0, 1000; gid 60");
    /* Too long for the buffer: cut, and says so. */
    ck_assert_str_eq(wb__auth_describe_clients(&a, buf, 12), "uid 0, 1...");

    wb_peer_creds p = creds(1234, 77, 9);
    ck_assert_int_eq(wb__auth_check_client(&a, &p, &err), WB_EPERM);
    ck_assert_str_eq(err.msg,
                     "uid 1234 is not allowed to lease models (allowed: uid 0, 1000, 1001; gid "
                     "50, 60); matched against gid 77 only (supplementary groups were not read)");
    wb__auth_destroy(&a);

    /* The state a fresh broker starts in: clients open, admins narrow. */
    wb__auth_init_open(&a, 1000);
    ck_assert(client_ok(&a, 4242, 4242));
    ck_assert(!admin_ok(&a, 4242, 4242));
    ck_assert_str_eq(wb__auth_describe_clients(&a, buf, sizeof buf), "everyone");
    /* Naming clients closes it. */
    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_CLIENT_UIDS, "5", "--allow-uid", &err), WB_OK);
    ck_assert(!client_ok(&a, 4242, 4242));
    ck_assert(client_ok(&a, 5, 4242));
    wb__auth_destroy(&a);

    /* The broker running as root lists root once. */
    wb__auth_init_default(&a, 0);
    ck_assert_str_eq(wb__auth_describe_clients(&a, buf, sizeof buf), "uid 0");
    wb__auth_destroy(&a);
}
END_TEST

START_TEST(handlers_refuse_strangers)
{
    fixture_model(&F.b, "demo");
    wb__auth_destroy(&F.b.auth);
    wb__auth_init_default(&F.b.auth, F.b.euid);
    wb_peer_creds me = creds(F.b.euid, (uint32_t)getegid(), (uint32_t)getpid());
    wb_peer_creds stranger = creds(stranger_uid(), 4321, (uint32_t)getpid());
    char want[200];
    if (F.b.euid == 0)
        snprintf(want, sizeof want, "uid %u is not allowed to lease models (allowed: uid 0)",
                 stranger.uid);
    else
        snprintf(want, sizeof want, "uid %u is not allowed to lease models (allowed: uid 0, %u)",
                 stranger.uid, F.b.euid);

    Wbproto__Reply *r = hello(&stranger);
    ck_assert_int_eq(r->status, WB_EPERM);
    ck_assert_str_eq(r->error, want);
    r = list_models(&stranger);
    ck_assert_int_eq(r->status, WB_EPERM);
    ck_assert_str_eq(r->error, want);
    r = acquire(&stranger, "demo");
    ck_assert_int_eq(r->status, WB_EPERM);
    ck_assert_str_eq(r->error, want);
    ck_assert_uint_eq(F.b.leases.n_leases, 0);
    r = unload(&stranger, "demo");
    ck_assert_int_eq(r->status, WB_EPERM);
    ck_assert_uint_eq(F.b.stats.requests_refused, 4);

    advance_ms(10); /* refusals do not depend on time; nor does this */
    r = hello(&me);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->hello->broker_instance, F.b.instance);
    ck_assert_uint_ne(F.b.instance, 0);

    /* Listed as a client by group: leases, but may not unload. */
    wb_err err;
    ck_assert_int_eq(wb__auth_add(&F.b.auth, WB_AUTH_CLIENT_GIDS, "4321", "--allow-gid", &err),
                     WB_OK);
    r = acquire(&stranger, "demo");
    ck_assert_msg(r->status == 0, "acquire: %s", r->error);
    r = unload(&stranger, "demo");
    ck_assert_int_eq(r->status, WB_EPERM);
    snprintf(want, sizeof want, "uid %u may not unload models", stranger.uid);
    ck_assert_str_eq(r->error, want);
    char path[128];
    snprintf(path, sizeof path, "%s/m.safetensors", F.dir);
    write_model(path);
    r = load(&stranger, "other", path);
    ck_assert_int_eq(r->status, WB_EPERM);
    snprintf(want, sizeof want, "uid %u may not load models", stranger.uid);
    ck_assert_str_eq(r->error, want);

    /* Listed as an administrator: loads what it can read itself. */
    ck_assert_int_eq(chmod(F.dir, 0755), 0);
    ck_assert_int_eq(chmod(path, 0644), 0);
    char uid[16];
    snprintf(uid, sizeof uid, "%u", stranger.uid);
    ck_assert_int_eq(wb__auth_add(&F.b.auth, WB_AUTH_ADMIN_UIDS, uid, "--admin-uid", &err), WB_OK);
    r = load(&stranger, "other", path);
    ck_assert_msg(r->status == 0, "load: %s", r->error);
    ck_assert_int_eq(r->load->model->state, WBPROTO__MODEL_STATE__MODEL_READY);
}
END_TEST

/* A peer who is not root loads only what it could read itself: every file
 * of the checkpoint (index and shards) is judged by the mode bits for its uid
 * and primary gid before any byte of it is read, so a refusal never carries
 * file contents (such as a header length decoded from /etc/shadow). */
START_TEST(load_needs_the_peers_own_access)
{
    wb_err err;
    wb_peer_creds admin = creds(stranger_uid(), 4321, (uint32_t)getpid());
    char uid[16];
    snprintf(uid, sizeof uid, "%u", admin.uid);
    ck_assert_int_eq(wb__auth_add(&F.b.auth, WB_AUTH_ADMIN_UIDS, uid, "--admin-uid", &err), WB_OK);
    char real[PATH_MAX], path[PATH_MAX + 64], want[2 * PATH_MAX];
    ck_assert_ptr_nonnull(realpath(F.dir, real));
    ck_assert_int_eq(chmod(real, 0755), 0);
    const char *tail = "; the broker loads only what the requesting user can read";
    unsigned me_uid = (unsigned)geteuid(), me_gid = (unsigned)getegid();

    /* A secret that is not a checkpoint: its first 8 bytes would read as a
     * header length of 8314597506838655090 ("rpw=abcs..."). */
    snprintf(path, sizeof path, "%s/shadow", real);
    write_text(path, "rpw=abcs:secret:19000:0:99999:7:::\n", 0600);
    Wbproto__Reply *r = load(&admin, "shadow", path);
    ck_assert_int_eq(r->status, WB_EPERM);
    snprintf(want, sizeof want,
             "uid %u (gid 4321) may not read %s (mode 0600, owner uid %u, gid %u)%s", admin.uid,
             path, me_uid, me_gid, tail);
    ck_assert_str_eq(r->error, want);
    ck_assert_ptr_null(strstr(r->error, "8314597506838655090"));
    ck_assert_uint_eq(F.b.models.n, 0);

    /* A checkpoint only its owner may read; then readable by others. */
    snprintf(path, sizeof path, "%s/private.safetensors", real);
    write_model(path);
    ck_assert_int_eq(chmod(path, 0600), 0);
    r = load(&admin, "private", path);
    ck_assert_int_eq(r->status, WB_EPERM);
    snprintf(want, sizeof want,
             "uid %u (gid 4321) may not read %s (mode 0600, owner uid %u, gid %u)%s", admin.uid,
             path, me_uid, me_gid, tail);
    ck_assert_str_eq(r->error, want);
    ck_assert_uint_eq(F.b.models.n, 0);
    /* Root loads anything the broker can read. */
    wb_peer_creds root = creds(0, 0, (uint32_t)getpid());
    if (geteuid() == 0) {
        r = load(&root, "private", path);
        ck_assert_msg(r->status == 0, "root load: %s", r->error);
        r = unload(&root, "private");
        ck_assert_int_eq(r->status, 0);
    }
    ck_assert_int_eq(chmod(path, 0604), 0);
    r = load(&admin, "private", path);
    ck_assert_msg(r->status == 0, "load: %s", r->error);

    /* The kernel's rule: the owner's bits govern the owner even when others'
     * would allow; the group's bits govern members of the primary group. */
    if (geteuid() == 0) {
        snprintf(path, sizeof path, "%s/owned.safetensors", real);
        write_model(path);
        ck_assert_int_eq(chown(path, admin.uid, 4321), 0);
        ck_assert_int_eq(chmod(path, 0044), 0);
        r = load(&admin, "owned", path);
        ck_assert_int_eq(r->status, WB_EPERM);
        snprintf(want, sizeof want,
                 "uid %u (gid 4321) may not read %s (mode 0044, owner uid %u, gid 4321)%s",
                 admin.uid, path, admin.uid, tail);
        ck_assert_str_eq(r->error, want);
        ck_assert_int_eq(chown(path, 0, 4321), 0);
        ck_assert_int_eq(chmod(path, 0040), 0);
        r = load(&admin, "owned", path);
        ck_assert_msg(r->status == 0, "group load: %s", r->error);
    }

    /* A readable file in a directory the peer may not search. */
    char sub[PATH_MAX + 16];
    snprintf(sub, sizeof sub, "%s/closed", real);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    snprintf(path, sizeof path, "%s/m.safetensors", sub);
    write_model(path);
    ck_assert_int_eq(chmod(path, 0644), 0);
    r = load(&admin, "closed", path);
    ck_assert_int_eq(r->status, WB_EPERM);
    snprintf(want, sizeof want,
             "uid %u (gid 4321) may not search the directory %s (mode 0700, owner uid %u, gid "
             "%u)%s",
             admin.uid, sub, me_uid, me_gid, tail);
    ck_assert_str_eq(r->error, want);

    /* A sharded checkpoint: the index and one shard readable, the other not. */
    snprintf(sub, sizeof sub, "%s/sharded", real);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    snprintf(path, sizeof path, "%s/a.safetensors", sub);
    write_tensor(path, "x");
    ck_assert_int_eq(chmod(path, 0644), 0);
    snprintf(path, sizeof path, "%s/b.safetensors", sub);
    write_tensor(path, "y");
    ck_assert_int_eq(chmod(path, 0600), 0);
    char index[PATH_MAX + 64];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", sub);
    write_text(index, "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"b.safetensors\"}}", 0644);
    r = load(&admin, "sharded", sub);
    ck_assert_int_eq(r->status, WB_EPERM);
    snprintf(want, sizeof want,
             "uid %u (gid 4321) may not read %s (mode 0600, owner uid %u, gid %u)%s", admin.uid,
             path, me_uid, me_gid, tail);
    ck_assert_str_eq(r->error, want);
    /* ... and the index itself unreadable. */
    ck_assert_int_eq(chmod(path, 0644), 0);
    ck_assert_int_eq(chmod(index, 0600), 0);
    r = load(&admin, "sharded", sub);
    ck_assert_int_eq(r->status, WB_EPERM);
    snprintf(want, sizeof want,
             "uid %u (gid 4321) may not read %s (mode 0600, owner uid %u, gid %u)%s", admin.uid,
             index, me_uid, me_gid, tail);
    ck_assert_str_eq(r->error, want);
    ck_assert_int_eq(chmod(index, 0644), 0);
    r = load(&admin, "sharded", sub);
    ck_assert_msg(r->status == 0, "sharded load: %s", r->error);
}
END_TEST

/* The loader judges every file it opens for the peer on its own, on the open
 * descriptor: what a swapped link leads to after the broker's check is
 * refused there. */
START_TEST(loader_judges_each_file)
{
    char real[PATH_MAX], path[PATH_MAX + 64], want[2 * PATH_MAX];
    ck_assert_ptr_nonnull(realpath(F.dir, real));
    ck_assert_int_eq(chmod(real, 0755), 0);
    snprintf(path, sizeof path, "%s/m.safetensors", real);
    write_model(path);
    ck_assert_int_eq(chmod(path, 0600), 0);
    wb_peer_creds peer = creds(stranger_uid(), 4321, (uint32_t)getpid());
    wb_load_access acc = wb__auth_load_access(&peer);
    ck_assert_int_eq(acc.enforce, 1);
    wb_load_opts o = {.backend = &wb__backend_host, .device = -1, .access = &acc};
    wb_model_data d;
    wb_err err = {0};
    ck_assert_int_eq(wb__load_ex(path, &o, &d, &err), WB_EPERM);
    snprintf(want, sizeof want,
             "uid %u (gid 4321) may not read %s (mode 0600, owner uid %u, gid %u); the broker "
             "loads only what the requesting user can read",
             peer.uid, path, (unsigned)geteuid(), (unsigned)getegid());
    ck_assert_str_eq(err.msg, want);
    /* Through a link: both names are given. */
    char link[PATH_MAX + 64];
    snprintf(link, sizeof link, "%s/link.safetensors", real);
    ck_assert_int_eq(symlink("m.safetensors", link), 0);
    ck_assert_int_eq(wb__load_ex(link, &o, &d, &err), WB_EPERM);
    ck_assert_ptr_nonnull(strstr(err.msg, " -> "));
    /* Root, and loads without a peer, are not judged. */
    wb_peer_creds root = creds(0, 0, (uint32_t)getpid());
    wb_load_access racc = wb__auth_load_access(&root);
    ck_assert_int_eq(racc.enforce, 0);
    ck_assert_int_eq(wb__auth_load_access(NULL).enforce, 0);
    ck_assert_int_eq(chmod(path, 0604), 0);
    ck_assert_msg(wb__load_ex(path, &o, &d, &err) == WB_OK, "%s", err.msg);
    wb__model_data_free(&d, &wb__backend_host);
}
END_TEST

/* With a loader, the load handler judges nothing itself: the load is
 * deferred at once with its name reserved (a second load of it is refused
 * as for any loading model), the checks run on the loader's thread, and
 * their refusal is the deferred reply, leaving no model and no load
 * counted. */
START_TEST(checks_run_on_the_loader)
{
    wb_err err;
    wb_peer_creds admin = creds(stranger_uid(), 4321, (uint32_t)getpid());
    char uid[16];
    snprintf(uid, sizeof uid, "%u", admin.uid);
    ck_assert_int_eq(wb__auth_add(&F.b.auth, WB_AUTH_ADMIN_UIDS, uid, "--admin-uid", &err), WB_OK);
    char real[PATH_MAX], path[PATH_MAX + 64], want[2 * PATH_MAX];
    ck_assert_ptr_nonnull(realpath(F.dir, real));
    ck_assert_int_eq(chmod(real, 0755), 0);
    snprintf(path, sizeof path, "%s/m.safetensors", real);
    write_model(path);
    ck_assert_int_eq(chmod(path, 0600), 0);

    wb_loader l;
    ck_assert_int_eq(wb__loader_start(&l, &err), WB_OK);
    F.b.loader = &l;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__LoadRequest lr = WBPROTO__LOAD_REQUEST__INIT;
    lr.name = "x";
    lr.path = path;
    req.version = WB_PROTOCOL_VERSION;
    req.id = 77;
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &lr;
    wb_ops_reply rep = WB_OPS_REPLY_INIT;
    ck_assert_int_eq(wb__ops_handle(&F.b, &admin, &req, F.ident, sizeof F.ident, &rep),
                     WB_OPS_DEFERRED);
    wb__ops_reply_free(&rep);
    const wb_model *m = wb__models_find(&F.b.models, "x");
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->state, WBPROTO__MODEL_STATE__MODEL_LOADING);
    Wbproto__Reply *r = load(&admin, "x", path);
    ck_assert_int_eq(r->status, WB_EEXIST);
    ck_assert_str_eq(r->error, "a model named 'x' already exists (loading)");

    struct pollfd pfd = {.fd = l.efd, .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 30000), 1);
    wb_load_job *job = wb__loader_take_done(&l);
    ck_assert_ptr_nonnull(job);
    ck_assert_ptr_null(job->next);
    wb_model *ready = NULL;
    ck_assert_int_eq(wb__broker_finish_load(&F.b, job, &ready), WB_EPERM);
    ck_assert_int_eq(job->refused, 1);
    ck_assert_ptr_null(ready);
    wb_ops_reply done = WB_OPS_REPLY_INIT;
    wb__ops_load_done(&F.b, job, ready, &done);
    ck_assert_uint_eq(done.msg.id, 77);
    ck_assert_int_eq(done.msg.status, WB_EPERM);
    snprintf(want, sizeof want,
             "uid %u (gid 4321) may not read %s (mode 0600, owner uid %u, gid %u); the broker "
             "loads only what the requesting user can read",
             admin.uid, path, (unsigned)geteuid(), (unsigned)getegid());
    ck_assert_str_eq(done.msg.error, want);
    wb__ops_reply_free(&done);
    wb__load_job_free(&job);
    ck_assert_ptr_null(wb__models_find(&F.b.models, "x"));
    ck_assert_uint_eq(F.b.stats.loads_total, 0);

    /* Readable, it loads through the same path. */
    ck_assert_int_eq(chmod(path, 0644), 0);
    req.id = 78;
    ck_assert_int_eq(wb__ops_handle(&F.b, &admin, &req, F.ident, sizeof F.ident, &rep),
                     WB_OPS_DEFERRED);
    wb__ops_reply_free(&rep);
    ck_assert_int_eq(poll(&pfd, 1, 30000), 1);
    job = wb__loader_take_done(&l);
    ck_assert_ptr_nonnull(job);
    ck_assert_msg(wb__broker_finish_load(&F.b, job, &ready) == WB_OK, "%s", job->err.msg);
    ck_assert_int_eq(job->refused, 0);
    ck_assert_ptr_nonnull(ready);
    ck_assert_int_eq(ready->state, WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_uint_eq(F.b.stats.loads_total, 1);
    wb__load_job_free(&job);
    ck_assert_ptr_null(wb__loader_stop(&l));
    F.b.loader = NULL;
}
END_TEST

START_TEST(load_paths)
{
    char file[128], link1[128], link2[128], fifo[128], fifolink[128], sub[128], missing[128];
    char resolved[PATH_MAX + 1], want[2 * PATH_MAX + 300];
    int is_dir = 1;
    wb_err err;
    snprintf(file, sizeof file, "%s/blob", F.dir);
    snprintf(link1, sizeof link1, "%s/model.safetensors", F.dir);
    snprintf(link2, sizeof link2, "%s/again.safetensors", F.dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", F.dir);
    snprintf(fifolink, sizeof fifolink, "%s/fifo.safetensors", F.dir);
    snprintf(sub, sizeof sub, "%s/sub", F.dir);
    snprintf(missing, sizeof missing, "%s/missing.safetensors", F.dir);
    write_model(file);
    ck_assert_int_eq(symlink("blob", link1), 0);
    ck_assert_int_eq(symlink(link1, link2), 0); /* a chain, as in some caches */
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(symlink(fifo, fifolink), 0);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    char real_dir[PATH_MAX];
    ck_assert_ptr_nonnull(realpath(F.dir, real_dir));
    char real_file[PATH_MAX + 8];
    snprintf(real_file, sizeof real_file, "%s/blob", real_dir);

    ck_assert_int_eq(wb__auth_check_load_path(file, resolved, sizeof resolved, &is_dir, &err),
                     WB_OK);
    ck_assert_int_eq(is_dir, 0);
    ck_assert_str_eq(resolved, real_file);
    /* A link whose final target is a regular file is fine, however long the
     * chain. */
    ck_assert_int_eq(wb__auth_check_load_path(link2, resolved, sizeof resolved, &is_dir, &err),
                     WB_OK);
    ck_assert_str_eq(resolved, real_file);
    ck_assert_int_eq(wb__auth_check_load_path(sub, resolved, sizeof resolved, &is_dir, &err),
                     WB_OK);
    ck_assert_int_eq(is_dir, 1);

    ck_assert_int_eq(wb__auth_check_load_path(fifo, resolved, sizeof resolved, &is_dir, &err),
                     WB_EINVAL);
    char real_fifo[PATH_MAX + 8];
    snprintf(real_fifo, sizeof real_fifo, "%s/fifo", real_dir);
    if (strcmp(fifo, real_fifo) == 0)
        snprintf(want, sizeof want,
                 "%s is a FIFO; only regular files (or a directory holding a checkpoint) can be "
                 "loaded",
                 fifo);
    else
        snprintf(want, sizeof want,
                 "%s -> %s is a FIFO; only regular files (or a directory holding a checkpoint) "
                 "can be loaded",
                 fifo, real_fifo);
    ck_assert_str_eq(err.msg, want);
    /* A link to a FIFO names both. */
    ck_assert_int_eq(wb__auth_check_load_path(fifolink, resolved, sizeof resolved, &is_dir, &err),
                     WB_EINVAL);
    snprintf(want, sizeof want, "%s -> %s/fifo is a FIFO", fifolink, real_dir);
    ck_assert_msg(strncmp(err.msg, want, strlen(want)) == 0, "got: %s", err.msg);
    ck_assert_int_eq(
        wb__auth_check_load_path("/dev/null", resolved, sizeof resolved, &is_dir, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "/dev/null is a character device; only regular files (or a "
                              "directory holding a checkpoint) can be loaded");
    ck_assert_int_eq(wb__auth_check_load_path(missing, resolved, sizeof resolved, &is_dir, &err),
                     WB_ENOTFOUND);
    snprintf(want, sizeof want, "no such file: %s", missing);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(wb__auth_check_load_path("", resolved, sizeof resolved, &is_dir, &err),
                     WB_EINVAL);

    if (geteuid() != 0) {
        /* Root reads everything; only others can see this refusal. */
        ck_assert_int_eq(chmod(file, 0), 0);
        ck_assert_int_eq(wb__auth_check_load_path(link1, resolved, sizeof resolved, &is_dir, &err),
                         WB_EPERM);
        ck_assert_ptr_nonnull(strstr(err.msg, "the broker may not read"));
        chmod(file, 0644);
    }
}
END_TEST

/* Through the load handler: the refusal comes before any loading, the
 * model is not registered, and a link to a regular file loads. */
START_TEST(load_handler_checks_paths)
{
    wb_peer_creds me = creds(F.b.euid, (uint32_t)getegid(), (uint32_t)getpid());
    char file[128], link[128], fifo[128];
    snprintf(file, sizeof file, "%s/blob", F.dir);
    snprintf(link, sizeof link, "%s/model.safetensors", F.dir);
    snprintf(fifo, sizeof fifo, "%s/pipe.safetensors", F.dir);
    write_model(file);
    ck_assert_int_eq(symlink("blob", link), 0);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);

    Wbproto__Reply *r = load(&me, "pipe", fifo);
    ck_assert_int_eq(r->status, WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(r->error, "is a FIFO"));
    ck_assert_ptr_null(wb__models_find(&F.b.models, "pipe"));
    ck_assert_uint_eq(F.b.stats.loads_total, 0);
    r = load(&me, "dev", "/dev/zero");
    ck_assert_int_eq(r->status, WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(r->error, "/dev/zero is a character device"));

    r = load(&me, "linked", link);
    ck_assert_msg(r->status == 0, "load: %s", r->error);
    /* The model keeps the path it was asked for. */
    ck_assert_str_eq(r->load->model->path, link);
    ck_assert_uint_eq(r->load->model->tensors, 1);
}
END_TEST

/* A peer whose supplementary groups were read (as at accept). */
static wb_peer_creds with_groups(uint32_t uid, uint32_t gid, const uint32_t *groups, uint32_t n)
{
    wb_peer_creds p = creds(uid, gid, 1234);
    p.groups.state = WB_GROUPS_READ;
    p.groups.n = p.groups.total = n;
    if (n)
        memcpy(p.groups.gid, groups, n * sizeof *groups);
    return p;
}

/* A gid on a list matches the primary gid or any supplementary group read
 * at accept; groups that could not be read match nothing, and every
 * refusal says what was matched. */
START_TEST(supplementary_groups_match)
{
    wb_auth a;
    wb_err err;
    char buf[400];
    wb__auth_init_default(&a, 0);
    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_CLIENT_GIDS, "4242", "--allow-gid", &err), WB_OK);
    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_ADMIN_GIDS, "60", "--admin-gid", &err), WB_OK);

    static const uint32_t member[] = {27, 4242, 100000};
    wb_peer_creds p = with_groups(65534, 65534, member, 3);
    ck_assert(wb__auth_client_ok(&a, &p));
    ck_assert(!wb__auth_admin_ok(&a, &p));
    ck_assert_int_eq(wb__auth_check_client(&a, &p, &err), WB_OK);
    ck_assert_int_eq(wb__auth_refuse_admin(&a, &p, "load", &err), WB_EPERM);
    ck_assert_str_eq(err.msg, "uid 65534 may not load models; matched against gid 65534 and "
                              "supplementary groups 27, 4242, 100000");
    ck_assert_str_eq(wb__auth_groups_field(&p, buf, sizeof buf), "27,4242,100000");
    static const uint32_t admin[] = {60};
    wb_peer_creds q = with_groups(65534, 65534, admin, 1);
    ck_assert(wb__auth_admin_ok(&a, &q));
    ck_assert(wb__auth_client_ok(&a, &q)); /* an administrator is a client */

    /* In no listed group: the refusal names what was matched. */
    static const uint32_t other[] = {27, 100};
    p = with_groups(65534, 65534, other, 2);
    ck_assert_int_eq(wb__auth_check_client(&a, &p, &err), WB_EPERM);
    ck_assert_str_eq(err.msg, "uid 65534 is not allowed to lease models (allowed: uid 0; gid 60, "
                              "4242); matched against gid 65534 and supplementary groups 27, 100");
    p = with_groups(65534, 65534, NULL, 0);
    ck_assert_int_eq(wb__auth_check_client(&a, &p, &err), WB_EPERM);
    ck_assert_str_eq(err.msg, "uid 65534 is not allowed to lease models (allowed: uid 0; gid 60, "
                              "4242); matched against gid 65534 (no supplementary groups)");
    ck_assert_str_eq(wb__auth_groups_field(&p, buf, sizeof buf), "none");
    /* Many groups: eight named, and how many in all. */
    uint32_t many[20];
    for (uint32_t i = 0; i < 20; i++)
        many[i] = 1000 + i;
    p = with_groups(65534, 65534, many, 20);
    ck_assert_str_eq(wb__auth_describe_gids(&p, buf, sizeof buf),
                     "gid 65534 and supplementary groups 1000, 1001, 1002, 1003, 1004, 1005, 1006, "
                     "1007, ... (20 in all)");

    /* Groups that could not be read match nothing, whatever gid[] holds:
     * the primary gid alone is matched, and the refusal says why. */
    p = with_groups(65534, 65534, member, 3);
    p.groups.state = WB_GROUPS_PID_HIDDEN;
    p.known = 0;
    p.pid_hidden = 1;
    p.pid = 0;
    ck_assert(!wb__auth_client_ok(&a, &p));
    ck_assert_int_eq(wb__auth_check_client(&a, &p, &err), WB_EPERM);
    ck_assert_str_eq(err.msg,
                     "uid 65534 is not allowed to lease models (allowed: uid 0; gid 60, 4242); "
                     "matched against gid 65534 only; supplementary groups could not be read "
                     "because the peer's pid is not visible from the broker (another pid "
                     "namespace)");
    ck_assert_str_eq(wb__auth_groups_field(&p, buf, sizeof buf), "unread:pid_hidden");
    /* The primary gid still counts for a hidden peer. */
    p.gid = 4242;
    ck_assert_int_eq(wb__auth_check_client(&a, &p, &err), WB_OK);

    static const struct {
        int state, err_no;
        const char *why;
    } reasons[] = {
        {WB_GROUPS_NO_PIDFD, 0, "no pidfd proves which process its pid names"},
        {WB_GROUPS_EXITED, 0, "the process exited while they were read"},
        {WB_GROUPS_OTHER_PROC, 0,
         "the broker's /proc does not show the process that connected as pid 1234 (a /proc of "
         "another pid namespace)"},
        {WB_GROUPS_IDS_CHANGED, 0,
         "/proc/1234/status shows another uid or gid than the connection's"},
        {WB_GROUPS_UNREADABLE, EACCES, "/proc/1234/status: Permission denied"},
        {WB_GROUPS_MALFORMED, 0, "/proc/1234/status could not be parsed"},
    };
    for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++) {
        p = with_groups(65534, 65534, member, 3);
        p.groups.state = reasons[i].state;
        p.groups.err_no = reasons[i].err_no;
        ck_assert(!wb__auth_client_ok(&a, &p));
        char want[400];
        snprintf(want, sizeof want,
                 "gid 65534 only; supplementary groups could not be read because %s",
                 reasons[i].why);
        ck_assert_str_eq(wb__auth_describe_gids(&p, buf, sizeof buf), want);
    }

    /* Without a gid list the groups are no part of the message. */
    wb__auth_destroy(&a);
    wb__auth_init_default(&a, 0);
    p = with_groups(65534, 65534, member, 3);
    ck_assert_int_eq(wb__auth_check_client(&a, &p, &err), WB_EPERM);
    ck_assert_str_eq(err.msg, "uid 65534 is not allowed to lease models (allowed: uid 0)");
    ck_assert_int_eq(wb__auth_refuse_admin(&a, &p, "unload", &err), WB_EPERM);
    ck_assert_str_eq(err.msg, "uid 65534 may not unload models");
    wb__auth_destroy(&a);
}
END_TEST

/* Parses `text` with room for `cap` groups; returns the status. */
static int parse(const char *text, wb_proc_ids *ids, uint32_t *groups, size_t cap, wb_err *err)
{
    return wb__auth_parse_status(text, strlen(text), ids, groups, cap, err);
}

START_TEST(status_parser)
{
    wb_proc_ids ids;
    wb_err err;
    uint32_t g[8];
    const char *head = "Name:\tbash\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t7\nPid:\t7\n"
                       "Uid:\t1000\t1001\t1002\t1003\nGid:\t2000\t2001\t2002\t2003\nFDSize:\t64\n";
    char text[512];
    /* No supplementary groups: the kernel writes a tab and a space. */
    snprintf(text, sizeof text, "%sGroups:\t \nNStgid:\t7\n", head);
    ck_assert_int_eq(parse(text, &ids, g, 8, &err), WB_OK);
    ck_assert_uint_eq(ids.n_groups, 0);
    ck_assert_uint_eq(ids.uid[0], 1000);
    ck_assert_uint_eq(ids.uid[1], 1001);
    ck_assert_uint_eq(ids.uid[3], 1003);
    ck_assert_uint_eq(ids.gid[1], 2001);
    /* ... or nothing at all after the tag. */
    snprintf(text, sizeof text, "%sGroups:\n", head);
    ck_assert_int_eq(parse(text, &ids, g, 8, &err), WB_OK);
    ck_assert_uint_eq(ids.n_groups, 0);
    /* One, with the kernel's trailing space. */
    snprintf(text, sizeof text, "%sGroups:\t4242 \nNStgid:\t7\n", head);
    ck_assert_int_eq(parse(text, &ids, g, 8, &err), WB_OK);
    ck_assert_uint_eq(ids.n_groups, 1);
    ck_assert_uint_eq(g[0], 4242);
    /* Many, ids above 65535 too, the last line without its newline. */
    snprintf(text, sizeof text, "%sGroups:\t0 27 4242 65536 100000 4294967294", head);
    ck_assert_int_eq(parse(text, &ids, g, 8, &err), WB_OK);
    ck_assert_uint_eq(ids.n_groups, 6);
    ck_assert_uint_eq(g[0], 0);
    ck_assert_uint_eq(g[3], 65536);
    ck_assert_uint_eq(g[5], 4294967294u);
    /* More than the room given: counted, the first ones kept. */
    uint32_t two[2] = {0, 0};
    ck_assert_int_eq(parse(text, &ids, two, 2, &err), WB_OK);
    ck_assert_uint_eq(ids.n_groups, 6);
    ck_assert_uint_eq(two[1], 27);
    ck_assert_int_eq(parse(text, &ids, NULL, 0, &err), WB_OK);
    ck_assert_uint_eq(ids.n_groups, 6);

    /* The most the kernel allows (NGROUPS_MAX, 65536), with 32-bit ids;
     * one more is refused. */
    size_t big = 64 * 1024 * 12 + 512;
    char *line = malloc(big);
    ck_assert_ptr_nonnull(line);
    size_t used = (size_t)snprintf(line, big, "%sGroups:\t", head);
    for (uint32_t i = 0; i < WB_PROC_GROUPS_MAX; i++)
        used += (size_t)snprintf(line + used, big - used, "%u ", 4000000000u + i);
    used += (size_t)snprintf(line + used, big - used, "\nNStgid:\t7\n");
    uint32_t *all = malloc(WB_PROC_GROUPS_MAX * sizeof *all);
    ck_assert_ptr_nonnull(all);
    ck_assert_int_eq(wb__auth_parse_status(line, used, &ids, all, WB_PROC_GROUPS_MAX, &err), WB_OK);
    ck_assert_uint_eq(ids.n_groups, WB_PROC_GROUPS_MAX);
    ck_assert_uint_eq(all[WB_PROC_GROUPS_MAX - 1], 4000000000u + WB_PROC_GROUPS_MAX - 1);
    used -= strlen("\nNStgid:\t7\n");
    used += (size_t)snprintf(line + used, big - used, "7 \n");
    ck_assert_int_eq(wb__auth_parse_status(line, used, &ids, all, WB_PROC_GROUPS_MAX, &err),
                     WB_EFORMAT);
    ck_assert_str_eq(err.msg, "the Groups: line is not a list of at most 65536 ids");
    free(all);
    free(line);

    /* Malformed files. */
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"Uid:\t1 1 1 1\nGid:\t2 2 2 2\n", "no Groups: line"},
        {"Uid:\t1 1 1 1\nGroups:\t3\n", "no Gid: line"},
        {"Gid:\t2 2 2 2\nGroups:\t3\n", "no Uid: line"},
        {"", "no Uid: line"},
        {"Uid:\t1 1 1\nGid:\t2 2 2 2\nGroups:\t3\n", "the Uid: line is not four ids"},
        {"Uid:\t1 1 1 1 1\nGid:\t2 2 2 2\nGroups:\t3\n", "the Uid: line is not four ids"},
        {"Uid:\t1 1 1 1\nGid:\t2 2 x 2\nGroups:\t3\n", "the Gid: line is not four ids"},
        {"Uid:\t1 1 1 1\nGid:\t2 2 2 2\nGroups:\t3 -4\n",
         "the Groups: line is not a list of at most 65536 ids"},
        {"Uid:\t1 1 1 1\nGid:\t2 2 2 2\nGroups:\t3,4\n",
         "the Groups: line is not a list of at most 65536 ids"},
        {"Uid:\t1 1 1 1\nGid:\t2 2 2 2\nGroups:\t4294967295\n",
         "the Groups: line is not a list of at most 65536 ids"},
        {"Uid:\t1 1 1 1\nGid:\t2 2 2 2\nGroups:\t99999999999999999999\n",
         "the Groups: line is not a list of at most 65536 ids"},
        {"Uid:\t1 1 1 1\nGid:\t2 2 2 2\nGroups:\t3\nGroups:\t4\n", "two Groups: lines"},
        {"Uid:\t1 1 1 1\nUid:\t1 1 1 1\nGid:\t2 2 2 2\nGroups:\t3\n", "two Uid: lines"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(parse(bad[i].text, &ids, g, 8, &err), WB_EFORMAT);
        ck_assert_str_eq(err.msg, bad[i].msg);
    }
    /* A NUL inside a line is no digit; tags only count at a line's start. */
    static const char nul[] = "Uid:\t1 1\0 1 1\nGid:\t2 2 2 2\nGroups:\t3\n";
    ck_assert_int_eq(wb__auth_parse_status(nul, sizeof nul - 1, &ids, g, 8, &err), WB_EFORMAT);
    ck_assert_int_eq(
        parse("Uid:\t1 1 1 1\nGid:\t2 2 2 2\nXGroups:\t3\nGroups:\t5\n", &ids, g, 8, &err), WB_OK);
    ck_assert_uint_eq(g[0], 5);
}
END_TEST

static int cmp_gid(const void *x, const void *y)
{
    gid_t a = *(const gid_t *)x, b = *(const gid_t *)y;
    return (a > b) - (a < b);
}

/* The groups of a real process, read through its pidfd: this one's; none
 * for a pid that is hidden, a missing pidfd, a process that has exited, or
 * a connection whose ids are not the process's. */
START_TEST(read_groups_of_processes)
{
    wb_auth a;
    wb__auth_init_default(&a, 0);
    wb_err err;
    int pidfd = wb__pidfd_open((uint32_t)getpid(), &err);
    ck_assert_int_ge(pidfd, 0);
    wb_peer_creds p = me();
    ck_assert_int_eq(wb__auth_read_groups(&a, &p, pidfd), WB_GROUPS_READ);
    gid_t mine[WB_PEER_GROUPS_MAX];
    int n = getgroups(WB_PEER_GROUPS_MAX, mine);
    ck_assert_int_ge(n, 0);
    qsort(mine, (size_t)n, sizeof mine[0], cmp_gid);
    ck_assert_uint_eq(p.groups.total, (unsigned)n);
    ck_assert_uint_eq(p.groups.n, (unsigned)n);
    for (int i = 0; i < n; i++)
        ck_assert_uint_eq(p.groups.gid[i], mine[i]);

    /* The connection's effective ids are not the process's. */
    p = creds((uint32_t)geteuid() + 1, (uint32_t)getegid(), (uint32_t)getpid());
    ck_assert_int_eq(wb__auth_read_groups(&a, &p, pidfd), WB_GROUPS_IDS_CHANGED);
    p = creds((uint32_t)geteuid(), (uint32_t)getegid() + 1, (uint32_t)getpid());
    ck_assert_int_eq(wb__auth_read_groups(&a, &p, pidfd), WB_GROUPS_IDS_CHANGED);
    /* A pidfd of another process than the pid names. */
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        pause();
        _exit(0);
    }
    int cfd = wb__pidfd_open((uint32_t)child, &err);
    ck_assert_int_ge(cfd, 0);
    p = me();
    /* Told apart by the pid the kernel shows for the pidfd (where it does:
     * its fdinfo's Pid: line). */
    char info[64], text[1024];
    snprintf(info, sizeof info, "/proc/self/fdinfo/%d", cfd);
    FILE *fi = fopen(info, "r");
    ck_assert_ptr_nonnull(fi);
    size_t got = fread(text, 1, sizeof text - 1, fi);
    fclose(fi);
    text[got] = '\0';
    if (strstr(text, "\nPid:") || strncmp(text, "Pid:", 4) == 0)
        ck_assert_int_eq(wb__auth_read_groups(&a, &p, cfd), WB_GROUPS_OTHER_PROC);
    /* The process exited: nothing read can be trusted to be its. */
    ck_assert_int_eq(kill(child, SIGKILL), 0);
    ck_assert_int_eq(waitpid(child, NULL, 0), child);
    p = creds((uint32_t)geteuid(), (uint32_t)getegid(), (uint32_t)child);
    ck_assert_int_eq(wb__auth_read_groups(&a, &p, cfd), WB_GROUPS_EXITED);
    ck_assert_uint_eq(p.groups.n, 0);
    close(cfd);

    p = me();
    ck_assert_int_eq(wb__auth_read_groups(&a, &p, -1), WB_GROUPS_NO_PIDFD);
    p = (wb_peer_creds){.uid = 5, .gid = 5, .pid_hidden = 1};
    ck_assert_int_eq(wb__auth_read_groups(&a, &p, pidfd), WB_GROUPS_PID_HIDDEN);
    close(pidfd);
    wb__auth_destroy(&a);
}
END_TEST

/* A process in more groups than are kept keeps those on the gid lists
 * first, so that an allow-list check stays exact (root: setgroups). */
START_TEST(read_many_groups)
{
    if (geteuid() != 0)
        return;
    enum { N = 300 };
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        gid_t list[N];
        for (int i = 0; i < N; i++)
            list[i] = (gid_t)(70000 + i);
        char c = setgroups(N, list) == 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char c = 0;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    ck_assert_int_eq(c, 'y');
    wb_auth a;
    wb_err err;
    wb__auth_init_default(&a, 0);
    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_CLIENT_GIDS, "70299,70150", "--allow-gid", &err),
                     WB_OK);
    ck_assert_int_eq(wb__auth_add(&a, WB_AUTH_ADMIN_GIDS, "70200", "--admin-gid", &err), WB_OK);
    int cfd = wb__pidfd_open((uint32_t)child, &err);
    ck_assert_int_ge(cfd, 0);
    wb_peer_creds p = creds((uint32_t)geteuid(), (uint32_t)getegid(), (uint32_t)child);
    ck_assert_int_eq(wb__auth_read_groups(&a, &p, cfd), WB_GROUPS_READ);
    ck_assert_uint_eq(p.groups.total, N);
    ck_assert_uint_eq(p.groups.n, WB_PEER_GROUPS_MAX);
    /* The listed ones, then the lowest others; sorted. */
    ck_assert_uint_eq(p.groups.gid[0], 70000);
    ck_assert_uint_eq(p.groups.gid[WB_PEER_GROUPS_MAX - 4], 70000 + WB_PEER_GROUPS_MAX - 4);
    ck_assert_uint_eq(p.groups.gid[WB_PEER_GROUPS_MAX - 3], 70150);
    ck_assert_uint_eq(p.groups.gid[WB_PEER_GROUPS_MAX - 2], 70200);
    ck_assert_uint_eq(p.groups.gid[WB_PEER_GROUPS_MAX - 1], 70299);
    p.uid = 65534; /* not listed by uid: by group alone */
    ck_assert(wb__auth_admin_ok(&a, &p));
    ck_assert(wb__auth_client_ok(&a, &p));
    char buf[300];
    ck_assert_str_eq(wb__auth_describe_gids(&p, buf, sizeof buf),
                     "gid 0 and supplementary groups 70000, 70001, 70002, 70003, 70004, 70005, "
                     "70006, 70007, ... (300 in all)");
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    close(cfd);
    wb__auth_destroy(&a);
}
END_TEST

/* Load access follows the kernel's rule with the supplementary groups: the
 * group's bits govern a member by any of its groups. */
START_TEST(load_access_by_supplementary_group)
{
    if (geteuid() != 0)
        return; /* files of another group need root */
    char real[PATH_MAX], path[PATH_MAX + 64], want[2 * PATH_MAX];
    ck_assert_ptr_nonnull(realpath(F.dir, real));
    ck_assert_int_eq(chmod(real, 0755), 0);
    snprintf(path, sizeof path, "%s/m.safetensors", real);
    write_model(path);
    ck_assert_int_eq(chown(path, 0, 4242), 0);
    ck_assert_int_eq(chmod(path, 0640), 0);
    static const uint32_t member[] = {27, 4242};
    wb_peer_creds peer = with_groups(stranger_uid(), 4321, member, 2);
    wb_load_access acc = wb__auth_load_access(&peer);
    wb_load_opts o = {.backend = &wb__backend_host, .device = -1, .access = &acc};
    wb_model_data d;
    ck_assert_int_eq(acc.enforce, 1);
    ck_assert_msg(wb__load_ex(path, &o, &d, &(wb_err){0}) == WB_OK, "a member may read it");
    wb__model_data_free(&d, &wb__backend_host);
    /* Not a member: refused, naming the groups judged. */
    static const uint32_t outsider[] = {27};
    peer = with_groups(stranger_uid(), 4321, outsider, 1);
    acc = wb__auth_load_access(&peer);
    wb_err err = {0};
    ck_assert_int_eq(wb__load_ex(path, &o, &d, &err), WB_EPERM);
    snprintf(want, sizeof want,
             "uid %u (gid 4321 and supplementary group 27) may not read %s (mode 0640, owner uid "
             "0, gid 4242); the broker loads only what the requesting user can read",
             peer.uid, path);
    ck_assert_str_eq(err.msg, want);
    /* Groups that could not be read: the primary gid alone, and why. */
    peer = with_groups(stranger_uid(), 4321, member, 2);
    peer.groups.state = WB_GROUPS_OTHER_PROC;
    acc = wb__auth_load_access(&peer);
    ck_assert_int_eq(wb__load_ex(path, &o, &d, &err), WB_EPERM);
    snprintf(want, sizeof want,
             "uid %u (gid 4321 only; supplementary groups could not be read because the broker's "
             "/proc does not show the process that connected as pid 1234 (a /proc of another pid "
             "namespace)) may not read %s (mode 0640, owner uid 0, gid 4242); the broker loads "
             "only what the requesting user can read",
             peer.uid, path);
    ck_assert_str_eq(err.msg, want);
}
END_TEST

START_TEST(slab_group)
{
    char sock[128];
    snprintf(sock, sizeof sock, "%s/broker.sock", F.dir);
    ck_assert_int_eq(chmod(F.dir, 0750), 0);
    ck_assert_int_eq(wb__auth_slab_group(sock), -1);
    if (geteuid() != 0)
        return; /* giving files to another group needs root */
    ck_assert_int_eq(chown(F.dir, (uid_t)-1, 65534), 0);
    ck_assert_int_eq(wb__auth_slab_group(sock), -1); /* not set-group-ID */
    ck_assert_int_eq(chmod(F.dir, 02750), 0);
    ck_assert_int_eq(wb__auth_slab_group(sock), 65534);

    wb_shm shm;
    wb_err err;
    ck_assert_int_eq(wb__shm_create(&shm, 4096, &err), WB_OK);
    ck_assert_int_eq(wb__auth_share_slab(shm.name, 65534, &err), WB_OK);
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", shm.name);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_gid, 65534);
    ck_assert_uint_eq(st.st_mode & 07777, 0640);
    wb__shm_unlink(&shm);
    ck_assert(!shm_name_exists(shm.name));
    ck_assert_int_eq(wb__auth_share_slab(shm.name, 65534, &err), WB_EIO);
    ck_assert_ptr_nonnull(strstr(err.msg, "shm_open"));
    wb__shm_unmap(&shm);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("auth");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, lists_parse_numbers_and_names);
    tcase_add_test(tc, who_passes);
    tcase_add_test(tc, handlers_refuse_strangers);
    tcase_add_test(tc, load_needs_the_peers_own_access);
    tcase_add_test(tc, loader_judges_each_file);
    tcase_add_test(tc, checks_run_on_the_loader);
    tcase_add_test(tc, load_paths);
    tcase_add_test(tc, load_handler_checks_paths);
    tcase_add_test(tc, supplementary_groups_match);
    tcase_add_test(tc, status_parser);
    tcase_add_test(tc, read_groups_of_processes);
    tcase_add_test(tc, read_many_groups);
    tcase_add_test(tc, load_access_by_supplementary_group);
    tcase_add_test(tc, slab_group);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
