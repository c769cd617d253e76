"""The stand-in tuningRunner.py's modules (run by the stand-in's own interpreter from bin/, not
imported by mlirtuna): the eras the package's stand-in speaks, E3 and E4, by module.

- common: what every era shares (the GPU it reports, log lines, config lists, .debug and .state
  files, the build's commit);
- problems: config strings parsed as perfRunner parses them (.debug columns, flops, E3's check
  and E4's canonical keys);
- candidates: the deterministic candidate lists and their times, one config "tuned";
- e3: rocMLIR 3fc5be9e's command line and main loop;
- e4: rocmlirTriton's command line (e4_tuning: its one-stage run and rows; e4_bundles:
  --compile-only and --benchmark-artifacts; e4_stream: the proposed --benchmark-stream).

Older eras (E2, E2.5), rocmlirTriton's other stored E4 line and the faults the tests inject live
with the tests (tests/support/standin_faults): a test build puts that overlay on the path, and
bin/tuningRunner.py lets it wrap the functions these modules name as its seams."""
