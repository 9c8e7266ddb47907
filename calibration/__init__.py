"""Measuring how accurately and how quickly CPU caps take effect.

Caps are the product's only lever on yields, so their precision bounds how
close the measured yields can come to the predicted ones (paper section 7,
assumption H5).  ``vcsched calibrate`` (cli/calibrate.py) drives:

* ``stats`` — pure statistics on progress traces (rate, absolute error,
  overhead, response time);
* ``experiment`` — the section-7 protocol over any ``Subjects`` backend;
* ``workload`` — the self-timestamping DGEMM worker process;
* ``cgroup_backend`` — workers under CFS bandwidth control (cgroup v1 or v2);
* ``cpus`` — choosing the least busy CPU and recording the machine's load;
* ``report`` — the JSON document, Markdown summary and PNG plot.

The libvirt backend lives in ``hypervisor.caps_probe`` (only ``hypervisor``
imports libvirt), with the guest it boots (``hypervisor.guest``) and the
frames it sends (``hypervisor.frames``); calibration never imports the lab.
docs/calibration.md has the method and the measured results.
"""
