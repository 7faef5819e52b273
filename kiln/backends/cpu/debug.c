#define KILN_DEBUG 1
#include <stdio.h>
#include <stdlib.h>
/* KILN_DEBUG: an index outside its buffer stops the process with the buffer and the line */
static inline int64_t kiln_checked(int64_t index, int64_t size, const char *buffer, int line) {
  if (index < 0 || index >= size) {
    fprintf(stderr, "kiln debug: index %lld outside %s[0, %lld) at line %d of the generated C\n", (long long)index, buffer, (long long)size, line);
    abort();
  }
  return index;
}
