"""``python -m minipar.elastic --np N [...] -- train ARGS`` (the same as ``minipar launch``)."""
import sys

from minipar.elastic import launch_main

sys.exit(launch_main())
