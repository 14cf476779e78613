/* test_static_control: the verbs scenario of test_shim_control.c with the (emulated) CUDA runtime
 * linked statically, as nvcc links by default: the program's allocations reach the shim through
 * the driver hooks, and the control channel opens all the same. */
#define CONTROL_STATIC 1
#include "test_shim_control.c"
