// MathJax for the prose pages' $...$ and $$...$$ (pymdownx.arithmatex, generic mode);
// mkdocs-jupyter's lesson pages typeset their own.
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"}
};
document$.subscribe(() => { MathJax.typesetPromise(); });
