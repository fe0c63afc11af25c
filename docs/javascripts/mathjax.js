// MathJax 3 for the whole site: the prose pages' math, which pymdownx.arithmatex wraps in
// \( \) and \[ \], and the lesson pages' notebook math, left as $...$ and $$...$$.
// Code (pre, code) is never typeset.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true
  }
};
document$.subscribe(() => {
  if (window.MathJax.typesetPromise) {
    MathJax.startup.output.clearCache();
    MathJax.typesetClear();
    MathJax.texReset();
    MathJax.typesetPromise();
  }
});
