/* Shared by the sources of kvtiers.policies._slotlinks (see _slotlinks.c). */
#ifndef KVTIERS_SLOTLINKS_H
#define KVTIERS_SLOTLINKS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

/* ARC's ghost lists (slotlinks_ghosts.c) and the key -> slot index
 * (slotlinks_index.c), added to the module by PyInit__slotlinks. */
extern PyTypeObject SlotlinksGhostsType;
extern PyTypeObject SlotlinksIndexType;

#endif
