/* pyframes.c: the Python frames of an allocating thread, for the trace's stacks.
 *
 * When the process runs a CPython interpreter (python3 running PyTorch, CuPy or JAX), the
 * frames of the Python code that led to an allocation are recorded as (file, function, line),
 * so the report names the line of the user's script. Everything comes from CPython's C API
 * found with dlsym in the process: nothing is linked, and a process without Python is
 * untouched. A code object's file and function names are looked up once and cached; the cache
 * keeps a reference to the code object, so its address is never reused for another while it
 * is cached. Reading frames needs the GIL, held while the cache is used.
 *
 * Frameworks release the GIL around their native work (PyTorch around every operator, so its
 * allocations happen without it). Such a thread still has its thread state, and its Python
 * frames stay as they were when it released the GIL: the shim takes the GIL back for the time
 * it reads them (PyGILState_Ensure/Release, what a C callback into Python does), unless
 * VMMSHIM_TRACE_PYTHON=held. Taking it waits while another thread runs Python, and could
 * deadlock if that thread waits on a lock the allocating thread holds around its cudaMalloc
 * (a framework's own allocator lock, say): `held` never waits, and records Python frames only
 * for threads that allocate with the GIL held. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/base.h"
#include "vmmshim/stacks.h"

typedef struct _object PyObj; /* opaque: only pointers are handled */

static struct {
  int (*is_initialized)(void);
  int (*gil_check)(void);
  void *(*this_thread_state)(void);
  PyObj *(*get_frame)(void);           /* PyEval_GetFrame: borrowed */
  PyObj *(*frame_code)(PyObj *);       /* PyFrame_GetCode: new reference */
  PyObj *(*frame_back)(PyObj *);       /* PyFrame_GetBack: new reference or NULL */
  int (*frame_line)(PyObj *);          /* PyFrame_GetLineNumber */
  PyObj *(*getattr)(PyObj *, const char *);
  const char *(*utf8)(PyObj *, ssize_t *);
  void (*incref)(PyObj *);
  void (*decref)(PyObj *);
  void (*err_fetch)(PyObj **, PyObj **, PyObj **);
  void (*err_restore)(PyObj *, PyObj *, PyObj *);
  int (*gil_ensure)(void);     /* PyGILState_Ensure */
  void (*gil_release)(int);    /* PyGILState_Release */
  int (*is_finalizing)(void);  /* Py_IsFinalizing (3.13), _Py_IsFinalizing before */
} py;

static int vs_py_mode;

bool _vs_pyframes_open(int mode) {
  if (mode == VS_PYTHON_OFF) return false;
#define VS_PY(field, name)                                              \
  if (!(*(void **)&py.field = _vs_real_dlsym(RTLD_DEFAULT, name))) { \
    if (strcmp(name, "Py_IsInitialized")) _vs_info("trace: no Python frames (%s not found)", name); \
    return false;                                                     \
  }
  VS_PY(is_initialized, "Py_IsInitialized");
  VS_PY(gil_check, "PyGILState_Check");
  VS_PY(this_thread_state, "PyGILState_GetThisThreadState");
  VS_PY(get_frame, "PyEval_GetFrame");
  VS_PY(frame_code, "PyFrame_GetCode"); /* CPython 3.9 and later */
  VS_PY(frame_back, "PyFrame_GetBack");
  VS_PY(frame_line, "PyFrame_GetLineNumber");
  VS_PY(getattr, "PyObject_GetAttrString");
  VS_PY(utf8, "PyUnicode_AsUTF8AndSize");
  VS_PY(incref, "Py_IncRef");
  VS_PY(decref, "Py_DecRef");
  VS_PY(err_fetch, "PyErr_Fetch");
  VS_PY(err_restore, "PyErr_Restore");
  VS_PY(gil_ensure, "PyGILState_Ensure");
  VS_PY(gil_release, "PyGILState_Release");
#undef VS_PY
  *(void **)&py.is_finalizing = _vs_real_dlsym(RTLD_DEFAULT, "Py_IsFinalizing");
  if (!py.is_finalizing) *(void **)&py.is_finalizing = _vs_real_dlsym(RTLD_DEFAULT, "_Py_IsFinalizing");
  /* Without a way to see finalization, a thread never takes the GIL: during finalization a
   * thread that asks for it is stopped for good. */
  vs_py_mode = py.is_finalizing ? mode : VS_PYTHON_HELD;
  return true;
}

/* code object -> string ids of its file and function */
#define VS_CODE_SLOTS (1u << 14)
typedef struct vs_code_s {
  PyObj *code;
  uint32_t file, func;
} vs_code_t;
static vs_code_t vs_codes[VS_CODE_SLOTS];
static unsigned vs_ncodes;

static uint32_t attr_string(PyObj *code, const char *attr) {
  PyObj *s = py.getattr(code, attr);
  if (!s) return 0;
  ssize_t len = 0;
  const char *text = py.utf8(s, &len);
  uint32_t id = text && len >= 0 ? _vs_string_intern(text, (size_t)len) : 0;
  py.decref(s);
  return id;
}

static const vs_code_t *code_names(PyObj *code, vs_code_t *scratch) {
  uintptr_t k = (uintptr_t)code;
  unsigned i = (unsigned)((k >> 4) * 0x9E3779B1u) & (VS_CODE_SLOTS - 1);
  for (unsigned n = 0; n < 8; n++, i = (i + 1) & (VS_CODE_SLOTS - 1)) {
    if (vs_codes[i].code == code) return &vs_codes[i];
    if (!vs_codes[i].code) break;
  }
  scratch->code = code;
  scratch->file = attr_string(code, "co_filename");
  scratch->func = attr_string(code, "co_qualname"); /* 3.11+: Class.method */
  if (!scratch->func) scratch->func = attr_string(code, "co_name");
  if (!vs_codes[i].code && vs_ncodes < VS_CODE_SLOTS / 2) {
    py.incref(code); /* kept alive while cached: its address stays its own */
    vs_codes[i] = *scratch;
    vs_ncodes++;
    return &vs_codes[i];
  }
  return scratch;
}

int _vs_pyframes_enter(void) {
  if (!py.is_initialized || !py.is_initialized()) return -1;
  if (py.gil_check()) return py.this_thread_state() ? 0 : -1;
  if (vs_py_mode != VS_PYTHON_ON || !py.this_thread_state() || py.is_finalizing()) return -1;
  return py.gil_ensure() + 1; /* the PyGILState_STATE (0 or 1) to give back, plus one */
}

void _vs_pyframes_leave(int token) {
  if (token > 0) py.gil_release(token - 1);
}

bool _vs_pyframes_wait(void) { return vs_py_mode == VS_PYTHON_ON; }

int _vs_pyframes(vs_pyframe_t *out, int max) {
  PyObj *frame = py.get_frame();
  if (!frame) return 0;
  PyObj *et, *ev, *etb;
  py.err_fetch(&et, &ev, &etb); /* an exception being handled stays as it was */
  py.incref(frame);
  int n = 0;
  while (frame && n < max) {
    PyObj *code = py.frame_code(frame);
    if (code) {
      vs_code_t scratch;
      const vs_code_t *c = code_names(code, &scratch);
      int line = py.frame_line(frame);
      out[n].file = c->file;
      out[n].func = c->func;
      out[n].line = line > 0 ? (uint32_t)line : 0;
      n++;
      py.decref(code);
    }
    PyObj *back = py.frame_back(frame);
    py.decref(frame);
    frame = back;
  }
  if (frame) py.decref(frame);
  py.err_restore(et, ev, etb);
  return n;
}

/* ------------------------------------------------------------------ for tag rules */

static pthread_once_t vs_rules_py_once = PTHREAD_ONCE_INIT;
static void rules_py_open(void) {
  int mode = (int)_vs_option(VS_OPT_TRACE_PYTHON);
  if (!py.is_initialized) _vs_pyframes_open(mode == VS_PYTHON_OFF ? VS_PYTHON_HELD : mode);
}

const void *_vs_pyframe_code(void) {
  pthread_once(&vs_rules_py_once, rules_py_open);
  int token = _vs_pyframes_enter();
  if (token < 0) return NULL;
  PyObj *frame = py.get_frame(), *code = frame ? py.frame_code(frame) : NULL;
  if (code) py.decref(code); /* a key only; the names keep it alive once it is one */
  _vs_pyframes_leave(token);
  return code;
}

static void copy_attr(PyObj *code, const char *attr, char *out, size_t n) {
  PyObj *s = py.getattr(code, attr);
  ssize_t len = 0;
  const char *text = s ? py.utf8(s, &len) : NULL;
  snprintf(out, n, "%.*s", text && len > 0 ? (int)len : 0, text ? text : "");
  if (s) py.decref(s);
}

void _vs_pyframe_names(const void *code, char *file, size_t nf, char *func, size_t nfn) {
  file[0] = func[0] = 0;
  int token = _vs_pyframes_enter();
  if (token < 0) return;
  PyObj *c = (PyObj *)code;
  PyObj *et, *ev, *etb;
  py.err_fetch(&et, &ev, &etb);
  py.incref(c); /* for good: a cached key's address is never another code object's */
  copy_attr(c, "co_filename", file, nf);
  copy_attr(c, "co_qualname", func, nfn);
  if (!func[0]) {
    py.err_restore(NULL, NULL, NULL);
    copy_attr(c, "co_name", func, nfn);
  }
  py.err_restore(et, ev, etb);
  _vs_pyframes_leave(token);
}
