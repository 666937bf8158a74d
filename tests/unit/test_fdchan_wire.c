/* The descriptor channel's messages (common/fdchan_wire.h): a request packs to
 * the magic and the id and parses back; a request of another size or magic
 * is refused naming what is wrong; a reply's message is cut at its bound,
 * and a header that announces too many descriptors or too long a message is
 * refused; the channel's path is the socket's plus ".fd", and one that does
 * not fit is refused. */
#include "fdchan_wire.h"

#include "text.h"

#include <check.h>

#include <string.h>

START_TEST(test_request_roundtrip)
{
    uint8_t id[WB_LEASE_ID_LEN], back[WB_LEASE_ID_LEN], req[WB_FDCHAN_REQUEST_LEN];
    for (int i = 0; i < WB_LEASE_ID_LEN; i++)
        id[i] = (uint8_t)(i * 17 + 3);
    wb__fdchan_request_pack(req, id);
    ck_assert_mem_eq(req, "WBF1", 4);
    wb_err err;
    int kind;
    ck_assert_int_eq(wb__fdchan_request_parse(req, sizeof req, &kind, back, &err), WB_OK);
    ck_assert_int_eq(kind, WB_FDCHAN_REQ_LEASE);
    ck_assert_mem_eq(back, id, WB_LEASE_ID_LEN);
    ck_assert_int_eq(wb__fdchan_request_parse(req, sizeof req - 1, &kind, back, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "descriptor request has 19 bytes, not 20");
    req[0] = 'X';
    ck_assert_int_eq(wb__fdchan_request_parse(req, sizeof req, &kind, back, &err), WB_EPROTO);
    ck_assert_int_eq(kind, 0);
    ck_assert_str_eq(err.msg,
                     "descriptor request does not start with \"WBF1\", \"WBS1\" or \"WBP1\"");
}
END_TEST

/* A session request is the magic and 16 zero bytes; anything else after
 * the magic is refused naming the byte, so the field stays free for later. */
START_TEST(test_session_request)
{
    uint8_t req[WB_FDCHAN_REQUEST_LEN], id[WB_LEASE_ID_LEN];
    wb__fdchan_session_request_pack(req);
    ck_assert_mem_eq(req, "WBS1", 4);
    wb_err err;
    int kind;
    ck_assert_int_eq(wb__fdchan_request_parse(req, sizeof req, &kind, id, &err), WB_OK);
    ck_assert_int_eq(kind, WB_FDCHAN_REQ_SESSION);
    req[9] = 0x7f;
    ck_assert_int_eq(wb__fdchan_request_parse(req, sizeof req, &kind, id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "session request: byte 9 is 0x7f, the 16 bytes after \"WBS1\" must "
                              "be zero");
}
END_TEST

START_TEST(test_session_token_hex)
{
    uint8_t t[WB_SESSION_TOKEN_LEN], back[WB_SESSION_TOKEN_LEN];
    for (int i = 0; i < WB_SESSION_TOKEN_LEN; i++)
        t[i] = (uint8_t)(i * 29 + 250);
    char hex[WB_SESSION_TOKEN_HEX + 1];
    wb__text_hex(hex, sizeof hex, t, WB_SESSION_TOKEN_LEN);
    ck_assert_str_eq(hex, "fa1734516e8ba8c5e2ff1c39567390ad");
    wb_err err;
    ck_assert_int_eq(wb__session_token_parse(hex, back, &err), WB_OK);
    ck_assert_mem_eq(back, t, WB_SESSION_TOKEN_LEN);
    ck_assert_int_eq(wb__session_token_parse("abc", back, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "a session token is 32 hex digits, not 3");
    hex[5] = 'G';
    ck_assert_int_eq(wb__session_token_parse(hex, back, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "a session token is lowercase hex; character 4 is not");
}
END_TEST

START_TEST(test_reply_header)
{
    uint8_t buf[WB_FDCHAN_REPLY_MAX];
    size_t len = wb__fdchan_reply_pack(buf, WB_EPERM, 0, "lease 01020304 belongs to pid 7");
    ck_assert_uint_eq(len, WB_FDCHAN_HEADER_LEN + strlen("lease 01020304 belongs to pid 7"));
    int32_t status;
    uint32_t n, ml;
    wb_err err;
    ck_assert_int_eq(wb__fdchan_header_parse(buf, &status, &n, &ml, &err), WB_OK);
    ck_assert_int_eq(status, WB_EPERM);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(ml, strlen("lease 01020304 belongs to pid 7"));
    ck_assert_mem_eq(buf + WB_FDCHAN_HEADER_LEN, "lease 01020304", 14);

    char longmsg[400];
    memset(longmsg, 'x', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = '\0';
    len = wb__fdchan_reply_pack(buf, WB_OK, 3, longmsg);
    ck_assert_uint_eq(len, WB_FDCHAN_REPLY_MAX);
    ck_assert_int_eq(wb__fdchan_header_parse(buf, &status, &n, &ml, &err), WB_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(ml, WB_FDCHAN_MSG_MAX);

    wb__fdchan_reply_pack(buf, WB_OK, 0, "");
    buf[8] = WB_FDCHAN_MAX_FDS + 1;
    ck_assert_int_eq(wb__fdchan_header_parse(buf, &status, &n, &ml, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "descriptor reply announces 17 descriptors, at most 16");
    wb__fdchan_reply_pack(buf, WB_OK, 0, "");
    buf[12] = 0xff;
    ck_assert_int_eq(wb__fdchan_header_parse(buf, &status, &n, &ml, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "descriptor reply announces a 255-byte message, at most 240");
    buf[0] = 'w';
    ck_assert_int_eq(wb__fdchan_header_parse(buf, &status, &n, &ml, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "descriptor reply does not start with \"WBF1\"");
}
END_TEST

START_TEST(test_path)
{
    char out[32];
    ck_assert_int_eq(wb__fdchan_path("/run/wbroker/broker.sock", out, sizeof out), WB_OK);
    ck_assert_str_eq(out, "/run/wbroker/broker.sock.fd");
    ck_assert_int_eq(wb__fdchan_path("/run/wbroker/broker.sock.xxxx", out, sizeof out), WB_EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fdchan_wire");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_request_roundtrip);
    tcase_add_test(tc, test_session_request);
    tcase_add_test(tc, test_session_token_hex);
    tcase_add_test(tc, test_reply_header);
    tcase_add_test(tc, test_path);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
