/* options.c: prints the shim's option table for scripts/gen-man7.sh, one line per variable
 * the shim reads: "VMMSHIM_NAME<TAB>DEFAULT<TAB>ACCEPTED", worded as src/base/config.c's messages
 * about a malformed value word them. Built from config.c alone (make: build/vmmshim-options),
 * so the man page states the defaults and accepted values the shim has, not a copy of them. */
#include <stdio.h>

#include "vmmshim/base.h"

/* config.c's messages go through log.c; this program reads no environment and has none. */
void _vs_log(vs_log_level_t level, const char *fmt, ...) {
  (void)level;
  (void)fmt;
}

void _vs_note(const char *fmt, ...) { (void)fmt; }

int main(void) {
  const char *name, *accepted;
  char def[64];
  for (int i = 0; _vs_option_describe(i, &name, &accepted, def, sizeof def) == 0; i++)
    printf("%s\t%s\t%s\n", name, def, accepted);
  return 0;
}
