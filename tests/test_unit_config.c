/* test_unit_config: src/config.c linked straight in: the size and boolean parsers, and
 * every option read from the environment, with the message a malformed value gets; a VMMSHIM_
 * variable that is no option gets one warning naming the nearest name, a known one none. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vmmshim/internal.h"
#include "check.h"

static void size_ok(const char *text, uint64_t want) {
  uint64_t v = 12345;
  int r = _vs_parse_size(text, &v);
  CHECK(r == 0 && v == want, "_vs_parse_size(\"%s\") = %d, %llu; want %llu", text, r, (unsigned long long)v,
        (unsigned long long)want);
}

static void size_bad(const char *text) {
  uint64_t v = 12345;
  int r = _vs_parse_size(text, &v);
  CHECK(r == -1, "_vs_parse_size(\"%s\") accepted: %llu", text ? text : "(null)", (unsigned long long)v);
  CHECK(v == 12345, "_vs_parse_size(\"%s\") wrote %llu on failure", text ? text : "(null)", (unsigned long long)v);
}

static void bool_is(const char *text, int want) {
  uint64_t v = 7;
  int r = _vs_parse_bool(text, &v);
  if (want < 0) CHECK(r == -1, "_vs_parse_bool(\"%s\") accepted: %llu", text ? text : "(null)", (unsigned long long)v);
  else CHECK(r == 0 && v == (uint64_t)want, "_vs_parse_bool(\"%s\") = %d, %llu", text, r, (unsigned long long)v);
}

static void signal_is(const char *text, int want) {
  uint64_t v = 77;
  int r = _vs_parse_signal(text, &v);
  if (want < 0) CHECK(r == -1, "_vs_parse_signal(\"%s\") accepted: %llu", text ? text : "(null)", (unsigned long long)v);
  else CHECK(r == 0 && v == (uint64_t)want, "_vs_parse_signal(\"%s\") = %d, %llu", text, r, (unsigned long long)v);
}

/* _vs_parse_limit: want_all, and device d's cap in want_dev[d] (dev 0..3 checked, the rest 0). */
static void limit_is(const char *text, uint64_t want_all, const uint64_t want_dev[4]) {
  uint64_t all = 7, dev[VS_LIMIT_DEVICES];
  memset(dev, 0x55, sizeof dev);
  int r = _vs_parse_limit(text, &all, dev);
  int ok = r == 0 && all == want_all;
  for (int d = 0; d < VS_LIMIT_DEVICES; d++) ok &= dev[d] == (d < 4 ? want_dev[d] : 0);
  CHECK(ok, "_vs_parse_limit(\"%s\") = %d, all %llu, dev0 %llu dev1 %llu", text, r, (unsigned long long)all,
        (unsigned long long)dev[0], (unsigned long long)dev[1]);
}

static void limit_bad(const char *text) {
  uint64_t all = 7, dev[VS_LIMIT_DEVICES];
  CHECK(_vs_parse_limit(text, &all, dev) == -1 && all == 7, "_vs_parse_limit(\"%s\") accepted", text ? text : "(null)");
}

static void on_limit_is(const char *text, int want_mode, uint64_t want_arg) {
  uint64_t mode = 9, arg = 9;
  int r = _vs_parse_on_limit(text, &mode, &arg);
  if (want_mode < 0) CHECK(r == -1, "_vs_parse_on_limit(\"%s\") accepted: %llu %llu", text ? text : "(null)",
                           (unsigned long long)mode, (unsigned long long)arg);
  else CHECK(r == 0 && mode == (uint64_t)want_mode && arg == want_arg, "_vs_parse_on_limit(\"%s\") = %d, %llu, %llu", text,
             r, (unsigned long long)mode, (unsigned long long)arg);
}

/* Runs _vs_config_reload + _vs_config_report (or, with print set, _vs_config_print) with stderr
 * captured; returns what was printed. */
static char captured[8192];
static const char *capture(bool print) {
  fflush(stderr);
  int fds[2];
  if (pipe(fds) != 0) return "";
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  int saved = dup(2);
  dup2(fds[1], 2);
  if (print) {
    _vs_config_print();
  } else {
    _vs_config_reload();
    _vs_config_report();
  }
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fds[1]);
  ssize_t n = read(fds[0], captured, sizeof captured - 1);
  close(fds[0]);
  captured[n > 0 ? n : 0] = 0;
  return captured;
}
static const char *reload_capture(void) { return capture(false); }

static void clear_env(void) {
  static const char *vars[] = {"VMMSHIM_DISABLE", "VMMSHIM_GRANULARITY", "VMMSHIM_FREE_MODE",
                               "VMMSHIM_RELEASE_THRESHOLD", "VMMSHIM_LIMIT", "VMMSHIM_RESERVE",
                               "VMMSHIM_ARENAS", "VMMSHIM_LOG", "VMMSHIM_STATS", "VMMSHIM_VERBOSE",
                               "VMMSHIM_DUMP_SIGNAL",
                               "VMMSHIM_TRACE", "VMMSHIM_TRACE_FORMAT", "VMMSHIM_TRACE_PYTHON",
                               "VMMSHIM_LIMIT_GROUP", "VMMSHIM_ON_LIMIT"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  size_ok("64M", 64ull << 20);
  size_ok("2GiB", 2ull << 30);
  size_ok("1k", 1024);
  size_ok("1K", 1024);
  size_ok("0", 0);
  size_ok(" 5 G", 5ull << 30);
  size_ok("1048576", 1048576);
  size_ok("3T", 3ull << 40);
  size_ok("7MB", 7ull << 20);
  size_ok("8mib", 8ull << 20);
  size_ok("12 ", 12);
  size_ok("18446744073709551615", UINT64_MAX);
  size_ok("16777215T", 16777215ull << 40);
  size_bad("garbage");
  size_bad("-1");
  size_bad("+1");
  size_bad("18446744073709551616");
  size_bad("99999999999T");
  size_bad("16777216T");
  size_bad("17179869184G");
  size_bad("1.5G");
  size_bad("");
  size_bad("   ");
  size_bad("12Q");
  size_bad("M");
  size_bad("1MM");
  size_bad("1 M B x");
  size_bad(NULL);

  bool_is("1", 1);
  bool_is("true", 1);
  bool_is("TRUE", 1);
  bool_is("yes", 1);
  bool_is("On", 1);
  bool_is("0", 0);
  bool_is("false", 0);
  bool_is("No", 0);
  bool_is("off", 0);
  bool_is("2", -1);
  bool_is("", -1);
  bool_is("maybe", -1);
  bool_is("1 ", -1);
  bool_is(NULL, -1);

  signal_is("USR2", SIGUSR2);
  signal_is("SIGUSR1", SIGUSR1);
  signal_is("sigusr1", SIGUSR1);
  signal_is("12", 12);
  signal_is("40", 40);
  signal_is("0", 0);
  signal_is("off", 0);
  signal_is("PWR", SIGPWR);
  signal_is("winch", SIGWINCH);
  signal_is("SIGURG", SIGURG);
  signal_is("10", SIGUSR1);
  signal_is("34", 34);
  signal_is("64", 64);
  /* termination, job control, faults, timers: their default action is the program's */
  static const char *refused[] = {"TERM", "SIGINT", "QUIT", "HUP", "PIPE", "CHLD", "ALRM", "CONT", "STOP", "TSTP",
                                  "TTIN", "TTOU", "KILL", "SEGV", "BUS", "FPE", "ILL", "ABRT", "TRAP", "SYS",
                                  "XCPU", "XFSZ", "VTALRM", "PROF", "IO"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) signal_is(refused[i], -1);
  for (int n = 1; n < 32; n++)
    if (n != SIGUSR1 && n != SIGUSR2 && n != SIGPWR && n != SIGWINCH && n != SIGURG) {
      char num[16];
      snprintf(num, sizeof num, "%d", n);
      signal_is(num, -1);
    }
  signal_is("32", -1); /* the C library's own (thread cancellation, setxid) */
  signal_is("33", -1);
  signal_is("65", -1);
  signal_is("KILL", -1);
  signal_is("9", -1);
  signal_is("11", -1); /* SIGSEGV: the shim must not swallow faults */
  signal_is("STOP", -1);
  signal_is("-1", -1);
  signal_is("999", -1);
  signal_is("12x", -1);
  signal_is("", -1);
  signal_is(NULL, -1);

  /* defaults */
  clear_env();
  const char *out = reload_capture();
  CHECK(_vs_option(VS_OPT_GRANULARITY) == 64ull << 20, "default granularity %llu",
        (unsigned long long)_vs_option(VS_OPT_GRANULARITY));
  CHECK(_vs_option(VS_OPT_FREE_MODE) == VS_FREE_SYNC, "default free mode");
  CHECK(_vs_option(VS_OPT_DISABLE) == 0 && _vs_option(VS_OPT_LIMIT) == 0 && _vs_option(VS_OPT_RESERVE) == 0,
        "defaults");
  CHECK(_vs_option(VS_OPT_RELEASE_THRESHOLD) == UINT64_MAX, "default release threshold");
  CHECK(_vs_option(VS_OPT_ARENAS) == 8, "default arenas %llu", (unsigned long long)_vs_option(VS_OPT_ARENAS));
  CHECK(_vs_option(VS_OPT_LOG) == VS_LOG_WARN, "default log level %llu", (unsigned long long)_vs_option(VS_OPT_LOG));
  CHECK(_vs_option_string(VS_OPT_TRACE) == NULL, "trace unset");
  CHECK(_vs_option(VS_OPT_DUMP_SIGNAL) == SIGUSR2, "default dump signal %llu",
        (unsigned long long)_vs_option(VS_OPT_DUMP_SIGNAL));
  CHECK(out[0] == 0, "messages with no variable set: %s", out);
  setenv("VMMSHIM_DUMP_SIGNAL", "WINCH", 1);
  out = reload_capture();
  CHECK(_vs_option(VS_OPT_DUMP_SIGNAL) == SIGWINCH && out[0] == 0, "VMMSHIM_DUMP_SIGNAL=WINCH");
  static const char *terminating[] = {"15", "2", "13", "17", "14", "HUP"};
  for (size_t i = 0; i < sizeof terminating / sizeof terminating[0]; i++) {
    setenv("VMMSHIM_DUMP_SIGNAL", terminating[i], 1);
    out = reload_capture();
    CHECK(_vs_option(VS_OPT_DUMP_SIGNAL) == SIGUSR2 && strstr(out, "VMMSHIM_DUMP_SIGNAL") && strstr(out, "refused"),
          "VMMSHIM_DUMP_SIGNAL=%s refused with a message, the default used: %llu '%s'", terminating[i],
          (unsigned long long)_vs_option(VS_OPT_DUMP_SIGNAL), out);
  }
  setenv("VMMSHIM_DUMP_SIGNAL", "SEGV", 1);
  out = reload_capture();
  CHECK(_vs_option(VS_OPT_DUMP_SIGNAL) == SIGUSR2 && strstr(out, "VMMSHIM_DUMP_SIGNAL") && strstr(out, "SEGV"),
        "VMMSHIM_DUMP_SIGNAL=SEGV refused with a message, the default used: '%s'", out);
  clear_env();

  /* valid values */
  setenv("VMMSHIM_GRANULARITY", "2M", 1);
  setenv("VMMSHIM_FREE_MODE", "Deferred", 1);
  setenv("VMMSHIM_LIMIT", "64M", 1);
  setenv("VMMSHIM_RELEASE_THRESHOLD", "unlimited", 1);
  setenv("VMMSHIM_RESERVE", "1T", 1);
  setenv("VMMSHIM_DISABLE", "yes", 1);
  setenv("VMMSHIM_LOG", "debug:/tmp/vmmshim-test.log", 1);
  setenv("VMMSHIM_TRACE", "/tmp/t-%p.csv", 1);
  setenv("VMMSHIM_TRACE_FORMAT", "rmm", 1);
  out = reload_capture();
  CHECK(out[0] == 0, "messages for valid values: %s", out);
  CHECK(_vs_option(VS_OPT_GRANULARITY) == 2ull << 20, "granularity %llu", (unsigned long long)_vs_option(VS_OPT_GRANULARITY));
  CHECK(_vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED, "free mode");
  CHECK(_vs_option(VS_OPT_LIMIT) == 64ull << 20, "limit");
  CHECK(_vs_option(VS_OPT_RELEASE_THRESHOLD) == UINT64_MAX, "release threshold");
  CHECK(_vs_option(VS_OPT_RESERVE) == 1ull << 40, "reserve");
  CHECK(_vs_option(VS_OPT_DISABLE) == 1, "disable");
  CHECK(_vs_option(VS_OPT_LOG) == VS_LOG_DEBUG, "log level %llu", (unsigned long long)_vs_option(VS_OPT_LOG));
  CHECK(_vs_option_string(VS_OPT_LOG) && !strcmp(_vs_option_string(VS_OPT_LOG), "debug:/tmp/vmmshim-test.log"),
        "log text");
  CHECK(_vs_option_string(VS_OPT_TRACE) && !strcmp(_vs_option_string(VS_OPT_TRACE), "/tmp/t-%p.csv"), "trace");
  CHECK(_vs_option(VS_OPT_TRACE_FORMAT) == VS_TRACE_RMM, "trace format");
  setenv("VMMSHIM_RELEASE_THRESHOLD", "256M", 1);
  reload_capture();
  CHECK(_vs_option(VS_OPT_RELEASE_THRESHOLD) == 256ull << 20, "release threshold 256M");

  /* arenas: a whole number from 1 to VS_MAX_ARENAS, else the default with a message */
  static const struct { const char *text; unsigned long long want; int msg; } arenas[] = {
      {"1", 1, 0}, {"64", 64, 0}, {" 3", 3, 0}, {"0", 8, 1}, {"65", 8, 1}, {"2K", 8, 1}, {"-1", 8, 1}, {"four", 8, 1}};
  for (size_t i = 0; i < sizeof arenas / sizeof arenas[0]; i++) {
    clear_env();
    setenv("VMMSHIM_ARENAS", arenas[i].text, 1);
    out = reload_capture();
    CHECK(_vs_option(VS_OPT_ARENAS) == arenas[i].want, "VMMSHIM_ARENAS='%s' -> %llu", arenas[i].text,
          (unsigned long long)_vs_option(VS_OPT_ARENAS));
    CHECK(!!strstr(out, "VMMSHIM_ARENAS") == arenas[i].msg, "VMMSHIM_ARENAS='%s' message: '%s'", arenas[i].text, out);
  }

  /* IPC timeout: whole seconds from 1 to 3600, else the default (10) with a message */
  static const struct { const char *text; unsigned long long want; int msg; } tmo[] = {
      {NULL, 10, 0}, {"1", 1, 0}, {"3600", 3600, 0}, {"0", 10, 1}, {"3601", 10, 1}, {"5s", 10, 1}, {"-2", 10, 1}};
  for (size_t i = 0; i < sizeof tmo / sizeof tmo[0]; i++) {
    clear_env();
    if (tmo[i].text) setenv("VMMSHIM_IPC_TIMEOUT", tmo[i].text, 1);
    else unsetenv("VMMSHIM_IPC_TIMEOUT");
    out = reload_capture();
    CHECK(_vs_option(VS_OPT_IPC_TIMEOUT) == tmo[i].want, "VMMSHIM_IPC_TIMEOUT='%s' -> %llu",
          tmo[i].text ? tmo[i].text : "(unset)", (unsigned long long)_vs_option(VS_OPT_IPC_TIMEOUT));
    CHECK(!!strstr(out, "VMMSHIM_IPC_TIMEOUT") == tmo[i].msg, "VMMSHIM_IPC_TIMEOUT='%s' message: '%s'",
          tmo[i].text ? tmo[i].text : "(unset)", out);
  }
  unsetenv("VMMSHIM_IPC_TIMEOUT");

  /* Sizes the pool rounds: at most 1 PiB, else the default with one message naming the variable */
  static const struct { const char *name, *text; vs_option_t opt; unsigned long long want; int msg; } big[] = {
      {"VMMSHIM_GRANULARITY", "1125899906842624", VS_OPT_GRANULARITY, 1ull << 50, 0},
      {"VMMSHIM_GRANULARITY", "1125899906842625", VS_OPT_GRANULARITY, 64ull << 20, 1},
      {"VMMSHIM_GRANULARITY", "18446744073709551615", VS_OPT_GRANULARITY, 64ull << 20, 1},
      {"VMMSHIM_MAX_HANDLE", "16777215T", VS_OPT_MAX_HANDLE, 0, 1},
      {"VMMSHIM_RESERVE", "17179869183G", VS_OPT_RESERVE, 0, 1},
      {"VMMSHIM_RESERVE", "1024T", VS_OPT_RESERVE, 1ull << 50, 0},
      {"VMMSHIM_LIMIT", "18446744073709551615", VS_OPT_LIMIT, UINT64_MAX, 0}};
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
    clear_env();
    unsetenv("VMMSHIM_MAX_HANDLE");
    setenv(big[i].name, big[i].text, 1);
    out = reload_capture();
    CHECK(_vs_option(big[i].opt) == big[i].want, "%s='%s' -> %llu", big[i].name, big[i].text,
          (unsigned long long)_vs_option(big[i].opt));
    CHECK(!!strstr(out, big[i].name) == big[i].msg, "%s='%s' message: '%s'", big[i].name, big[i].text, out);
    unsetenv(big[i].name);
  }

  /* Python frames: on (default), held, off; booleans too; anything else the default */
  static const struct { const char *text; unsigned long long want; int msg; } pys[] = {
      {NULL, VS_PYTHON_ON, 0}, {"held", VS_PYTHON_HELD, 0}, {"HELD", VS_PYTHON_HELD, 0}, {"on", VS_PYTHON_ON, 0},
      {"1", VS_PYTHON_ON, 0},  {"off", VS_PYTHON_OFF, 0},   {"0", VS_PYTHON_OFF, 0},     {"hold", VS_PYTHON_ON, 1}};
  for (size_t i = 0; i < sizeof pys / sizeof pys[0]; i++) {
    clear_env();
    if (pys[i].text) setenv("VMMSHIM_TRACE_PYTHON", pys[i].text, 1);
    out = reload_capture();
    CHECK(_vs_option(VS_OPT_TRACE_PYTHON) == pys[i].want, "VMMSHIM_TRACE_PYTHON='%s' -> %llu",
          pys[i].text ? pys[i].text : "(unset)", (unsigned long long)_vs_option(VS_OPT_TRACE_PYTHON));
    CHECK(!!strstr(out, "VMMSHIM_TRACE_PYTHON") == pys[i].msg, "VMMSHIM_TRACE_PYTHON='%s' message: '%s'",
          pys[i].text ? pys[i].text : "(unset)", out);
  }

  /* malformed values: the default, and one message naming the variable and the value */
  clear_env();
  setenv("VMMSHIM_GRANULARITY", "12Q", 1);
  out = reload_capture();
  CHECK(_vs_option(VS_OPT_GRANULARITY) == 64ull << 20, "granularity after 12Q: %llu",
        (unsigned long long)_vs_option(VS_OPT_GRANULARITY));
  CHECK(strstr(out, "VMMSHIM_GRANULARITY") && strstr(out, "12Q"), "message for 12Q: '%s'", out);
  setenv("VMMSHIM_GRANULARITY", "0", 1);
  out = reload_capture();
  CHECK(_vs_option(VS_OPT_GRANULARITY) == 64ull << 20, "granularity after 0");
  CHECK(strstr(out, "VMMSHIM_GRANULARITY") != NULL, "message for 0: '%s'", out);
  setenv("VMMSHIM_GRANULARITY", "1.5G", 1);
  out = reload_capture();
  CHECK(_vs_option(VS_OPT_GRANULARITY) == 64ull << 20, "granularity after 1.5G");
  CHECK(strstr(out, "VMMSHIM_GRANULARITY") && strstr(out, "1.5G"), "message for 1.5G: '%s'", out);
  clear_env();
  setenv("VMMSHIM_FREE_MODE", "later", 1);
  setenv("VMMSHIM_LIMIT", "lots", 1);
  setenv("VMMSHIM_DISABLE", "perhaps", 1);
  setenv("VMMSHIM_LOG", "loud", 1);
  setenv("VMMSHIM_TRACE_FORMAT", "xml", 1);
  out = reload_capture();
  CHECK(_vs_option(VS_OPT_FREE_MODE) == VS_FREE_SYNC && _vs_option(VS_OPT_LIMIT) == 0 &&
            _vs_option(VS_OPT_DISABLE) == 0 && _vs_option(VS_OPT_LOG) == VS_LOG_WARN &&
            _vs_option(VS_OPT_TRACE_FORMAT) == VS_TRACE_NATIVE,
        "defaults after malformed values");
  CHECK(strstr(out, "VMMSHIM_FREE_MODE") && strstr(out, "later"), "free mode message: '%s'", out);
  CHECK(strstr(out, "VMMSHIM_LIMIT") && strstr(out, "lots"), "limit message");
  CHECK(strstr(out, "VMMSHIM_DISABLE") && strstr(out, "perhaps"), "disable message");
  CHECK(strstr(out, "VMMSHIM_LOG") && strstr(out, "loud"), "log message");
  CHECK(strstr(out, "VMMSHIM_TRACE_FORMAT") && strstr(out, "xml"), "trace format message");
  /* VMMSHIM_LIMIT: one size for every device together, and/or DEVICE:SIZE */
  const uint64_t G = 1ull << 30, none[4] = {0, 0, 0, 0}, d01[4] = {8 * G, 4 * G, 0, 0}, d3[4] = {0, 0, 0, 2 * G};
  limit_is("8G", 8 * G, none);
  limit_is("0:8G,1:4G", 0, d01);
  limit_is("12G,3:2G", 12 * G, d3);
  limit_is("3:2G, 12G", 12 * G, d3);
  limit_is("0", 0, none);
  limit_bad("");
  limit_bad("8G,9G");      /* two sizes for every device */
  limit_bad("0:1G,0:2G");  /* a device twice */
  limit_bad("16:1G");      /* past VS_LIMIT_DEVICES */
  limit_bad("-1:1G");
  limit_bad("x:1G");
  limit_bad("0:");
  limit_bad("8G,");
  limit_bad("1.5G");
  /* VMMSHIM_ON_LIMIT */
  on_limit_is("fail", VS_ON_LIMIT_FAIL, 0);
  on_limit_is("wait", VS_ON_LIMIT_WAIT, 0);
  on_limit_is("wait:30", VS_ON_LIMIT_WAIT, 30);
  on_limit_is("HOST", VS_ON_LIMIT_HOST, 0);
  on_limit_is("host:4G", VS_ON_LIMIT_HOST, 4 * G);
  on_limit_is("wait:0", -1, 0);
  on_limit_is("wait:1G", -1, 0);
  on_limit_is("wait:", -1, 0);
  on_limit_is("host:0", -1, 0);
  on_limit_is("fail:1", -1, 0);
  on_limit_is("spill", -1, 0);
  /* Whose VMMSHIM_LIMIT is it: the process's own cap, or the budget's (a group, per device, wait). */
  clear_env();
  setenv("VMMSHIM_LIMIT", "8G", 1);
  out = reload_capture();
  CHECK(out[0] == 0 && _vs_option(VS_OPT_LIMIT) == 8 * G && !_vs_limit_in_budget() && _vs_limit_setting(-1) == 8 * G,
        "8G alone is the process's own cap: %llu '%s'", (unsigned long long)_vs_option(VS_OPT_LIMIT), out);
  setenv("VMMSHIM_LIMIT_GROUP", "jobs", 1);
  out = reload_capture();
  CHECK(out[0] == 0 && _vs_option(VS_OPT_LIMIT) == 0 && _vs_limit_in_budget() && _vs_limit_setting(-1) == 8 * G &&
            !strcmp(_vs_option_string(VS_OPT_LIMIT_GROUP), "jobs"),
        "with a group it is the group's: own cap %llu", (unsigned long long)_vs_option(VS_OPT_LIMIT));
  setenv("VMMSHIM_LIMIT_GROUP", "no/slash", 1);
  out = reload_capture();
  CHECK(strstr(out, "VMMSHIM_LIMIT_GROUP") && strstr(out, "no/slash") && !_vs_limit_in_budget() &&
            _vs_option(VS_OPT_LIMIT) == 8 * G,
        "a bad group name: a message, and the process's own cap: '%s'", out);
  unsetenv("VMMSHIM_LIMIT_GROUP");
  setenv("VMMSHIM_LIMIT", "2G,1:1G", 1);
  out = reload_capture();
  CHECK(_vs_limit_in_budget() && _vs_option(VS_OPT_LIMIT) == 0 && _vs_limit_setting(-1) == 2 * G &&
            _vs_limit_setting(1) == G && _vs_limit_setting(0) == 0 && _vs_limit_setting(99) == 0,
        "a per-device cap is the budget's");
  setenv("VMMSHIM_LIMIT", "2G", 1);
  setenv("VMMSHIM_ON_LIMIT", "wait:5", 1);
  out = reload_capture();
  CHECK(_vs_limit_in_budget() && _vs_option(VS_OPT_ON_LIMIT) == VS_ON_LIMIT_WAIT && _vs_option_arg(VS_OPT_ON_LIMIT) == 5,
        "waited for, it is the budget's");
  setenv("VMMSHIM_ON_LIMIT", "host:1G", 1);
  out = reload_capture();
  CHECK(!_vs_limit_in_budget() && _vs_option(VS_OPT_LIMIT) == 2 * G && _vs_option_arg(VS_OPT_ON_LIMIT) == G,
        "host alone leaves it the process's own");
  setenv("VMMSHIM_ON_LIMIT", "later", 1);
  out = reload_capture();
  CHECK(_vs_option(VS_OPT_ON_LIMIT) == VS_ON_LIMIT_FAIL && strstr(out, "VMMSHIM_ON_LIMIT") && strstr(out, "later"),
        "a bad VMMSHIM_ON_LIMIT: fail, and a message: '%s'", out);
  /* The wording of refused values: the device range as numbers, no "the default default". */
  clear_env();
  setenv("VMMSHIM_LIMIT", "16:1G", 1);
  out = reload_capture();
  CHECK(strstr(out, "DEVICE 0 to 15)") && !strstr(out, " - 1"), "limit device range worded: '%s'", out);
  unsetenv("VMMSHIM_LIMIT");
  setenv("VMMSHIM_TAG", "no/slash", 1);
  out = reload_capture();
  CHECK(strstr(out, "VMMSHIM_TAG") && strstr(out, "using the default tag 'untagged'") && !strstr(out, "default default"),
        "bad tag worded: '%s'", out);
  unsetenv("VMMSHIM_TAG");
  setenv("VMMSHIM_GRANULARITY", "0", 1);
  out = reload_capture();
  CHECK(strstr(out, "using the default 64M"), "granularity 0 worded: '%s'", out);
  clear_env();
  reload_capture();
  out = capture(true); /* VMMSHIM_VERBOSE's list */
  CHECK(strstr(out, "option VMMSHIM_TAG = tag 'untagged' (default)") && !strstr(out, "= untagged (default)"),
        "verbose tag worded: '%s'", out);

  /* A VMMSHIM_ variable that is no option: one warning, naming the nearest name when one is near. */
  static const struct { const char *name, *want; } unknown[] = {
      {"VMMSHIM_LIMT", "VMMSHIM_LIMT is not a vmmshim variable; did you mean VMMSHIM_LIMIT?\n"},
      {"VMMSHIM_limit", "did you mean VMMSHIM_LIMIT?"},
      {"VMMSHIM_GRANUALRITY", "did you mean VMMSHIM_GRANULARITY?"},
      {"VMMSHIM_FREEMODE", "did you mean VMMSHIM_FREE_MODE?"},
      {"VMMSHIM_STACKS", "did you mean VMMSHIM_TRACE_STACKS?"},
      {"VMMSHIM_TRACE_MAXX", "did you mean VMMSHIM_TRACE_MAX?"},
      {"VMMSHIM_LIBB", "did you mean VMMSHIM_LIB?"},
      {"VMMSHIM_XYZZY", "VMMSHIM_XYZZY is not a vmmshim variable (ignored; man 7 vmmshim lists them)\n"},
      {"VMMSHIM_", "VMMSHIM_ is not a vmmshim variable (ignored"}};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    setenv(unknown[i].name, "1G", 1);
    out = reload_capture();
    const char *w = strstr(out, "vmmshim: warning: ");
    CHECK(w && strstr(out, unknown[i].want) && !strstr(w + 1, "vmmshim: warning: ") && _vs_option(VS_OPT_LIMIT) == 0,
          "%s: want one warning with '%s': '%s'", unknown[i].name, unknown[i].want, out);
    unsetenv(unknown[i].name);
  }
  /* known names, options or the launcher's and tools' own: no warning */
  static const char *known[] = {"VMMSHIM_LIMIT", "VMMSHIM_TRACE_STACKS", "VMMSHIM_LIB", "VMMSHIM_AS", "VMMSHIM_PROGRESS_DELAY",
                                "VMMSHIM_DEPS_APT", "VMMSHIM_DEPS_INCLUDE", "VMMSHIM_DEPS_LIBDIRS", "VMMSHIMX",
                                "XVMMSHIM_LIMT"};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    setenv(known[i], "1", 1);
    out = reload_capture();
    CHECK(out[0] == 0, "%s set: no warning, got '%s'", known[i], out);
    unsetenv(known[i]);
  }
  /* many unknown ones: at most 8 lines and a count of the rest */
  char nm[32];
  for (int i = 0; i < 11; i++) {
    snprintf(nm, sizeof nm, "VMMSHIM_QQQ%d", i);
    setenv(nm, "1", 1);
  }
  out = reload_capture();
  int lines = 0;
  for (const char *p = out; (p = strstr(p, "vmmshim: warning: ")); p++) lines++;
  CHECK(lines == 9 && strstr(out, "3 more VMMSHIM_ variables"), "11 unknown: %d lines: '%s'", lines, out);
  for (int i = 0; i < 11; i++) {
    snprintf(nm, sizeof nm, "VMMSHIM_QQQ%d", i);
    unsetenv(nm);
  }
  out = reload_capture();
  CHECK(out[0] == 0, "unknown variables gone, warnings gone: '%s'", out);

  /* a valid value after a malformed one: no stale message */
  clear_env();
  setenv("VMMSHIM_GRANULARITY", "4M", 1);
  out = reload_capture();
  CHECK(out[0] == 0 && _vs_option(VS_OPT_GRANULARITY) == 4ull << 20, "stale message or value: '%s'", out);
  clear_env();
  reload_capture();
  return check_summary();
}
