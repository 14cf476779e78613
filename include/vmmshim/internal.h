/* vmmshim internals, every layer at once: for the tests that link the shim's sources
 * straight in. The shim's own files include only their layer's header and those below
 * (vmmshim/base.h says which layers there are; tests/scripts/test_layers.py checks it). */
#ifndef VMMSHIM_INTERNAL_H
#define VMMSHIM_INTERNAL_H

#include "vmmshim/alloc.h"

#endif
