"""Reports as self-contained HTML pages (plotly.js inline, nothing fetched): the presentation layer.

:func:`job_report` renders a :class:`~tracelake.warehouse.JobReport`, :func:`fleet_report`
a :class:`~tracelake.warehouse.Fleet`; the CLI (``tracelake report``) and the API
(``/api/v1/jobs/{job}/report``, ``/api/v1/reports/fleet``) only choose where the links go
and where the page is written.
"""

from .fleet import render as fleet_report
from .job import render as job_report

__all__ = ["fleet_report", "job_report"]
