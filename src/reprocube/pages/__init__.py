"""What people look at: the HTML report pages and their figures (matplotlib through reprocube.pages.plots).
The runs page (runs_page), the reproduction page (reproduction_page), the study's box plot
(study_figure) and what they share (html)."""
