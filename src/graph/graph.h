/* CUDA graphs (internal). */
#ifndef SAFECUDA_GRAPH_GRAPH_H
#define SAFECUDA_GRAPH_GRAPH_H

#include "driver/driver.h"

/* The driver's executable graph behind exec, or NULL when exec is stale or not an
 * executable graph (with sc_last_error() saying why). For benchmarks and tests that
 * compare sc_graph_launch with a raw cuGraphLaunch of the same work: nothing is checked,
 * ordered or tracked through it. The pointer is valid only while exec lives and until the
 * next sc_graph_exec_update of it (which may replace it by re-instantiating). */
CUgraphExec sci_graph_exec_cu(sc_graph_exec exec);

#endif
