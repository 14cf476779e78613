/* pyframes.c: the Python frames of an allocating thread, for the trace's stacks.
 *
 * When the process runs a CPython interpreter (python3 running PyTorch, CuPy or JAX) and the
 * allocating thread holds its GIL, the frames of the Python code that led to the allocation
 * are recorded as (file, function, line), so the report names the line of the user's script.
 * Everything comes from CPython's C API found with dlsym in the process: nothing is linked,
 * and a process without Python is untouched. A code object's file and function names are
 * looked up once and cached; the cache keeps a reference to the code object, so its address
 * is never reused for another while it is cached. Called with the stacks lock held. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/internal.h"
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
} py;

bool _vs_pyframes_open(void) {
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
#undef VS_PY
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

int _vs_pyframes(vs_pyframe_t *out, int max) {
  if (!py.is_initialized() || !py.gil_check() || !py.this_thread_state()) return 0;
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
