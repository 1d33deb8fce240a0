// GNUstep's headers include this name when the compiler has blocks; the
// blocks runtime of libblocksruntime-dev ships the same declarations as
// <Block.h>.
#include <Block.h>
