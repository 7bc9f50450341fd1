"""The HDF5 run log: one append-only, crash-safe (SWMR) file per run segment, and its reader."""
