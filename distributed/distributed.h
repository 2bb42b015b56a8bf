// ember::distributed in one include: the process group and collectives (collectives.h) and
// DistributedDataParallel (ddp.h). Built when CMake finds MPI: the target ember::distributed.
#pragma once

#include "distributed/collectives.h"
#include "distributed/ddp.h"
