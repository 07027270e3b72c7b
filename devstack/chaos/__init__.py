"""The soak (`python bench/soak.py`, issue 43): the whole platform on this machine under
steady load and a seeded schedule of overlapping faults, then a final heal, judged by a
checker over the recorded history.

Modules, one concept each: `schedule` (the faults, from a seed), `etcd_cluster` (three
members), `speed` (two masters, three workers, a gateway), `platform` (everything started as
a user would), `supervisor` (restarts, loud errors), `injectors` (carrying out the faults,
recovery probes), `recorder` (answers, cursors, commits), `delta_read` + `checker` (the
verdict), `plant` (the negative control), `report`, `run` (one soak), `cli`.
"""
