"""Object storage for run directories (issue #26): runs on S3, GCS, Azure or
any fsspec filesystem, reached by URL. Local paths stay the fast path: this
package imports nothing (fsspec above all) until a URL is used.

* :mod:`.urls`: which text is a URL, which URLs name no place, which extra
  brings a protocol's package.
* :mod:`.store`: a :class:`~fastprof.storage.store.Store` over an fsspec
  filesystem; objects are written once and never replaced by another job.
* :mod:`.spool` and :mod:`.uploader`: what a Recorder with a URL ``out_dir``
  does (a local spool, and the thread that uploads its closed files).
* :mod:`.backend`: the fsspec backend the core reads URL inputs through
  (registered at ``import fastprof``).
* :mod:`.run_view`: one view of a run wherever it lives (a local folder, a
  store), which every verb and report reads a run through.
"""
