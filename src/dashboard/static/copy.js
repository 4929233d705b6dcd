// The copy button of a new key. Everything works without it: the key is
// plain text on the page and can be selected by hand.
document.addEventListener("DOMContentLoaded", function () {
  var button = document.querySelector('[data-testid="copy-key"]');
  var key = document.querySelector('[data-testid="new-key"]');
  if (!button || !key || !navigator.clipboard) return;
  button.hidden = false;
  button.addEventListener("click", function () {
    navigator.clipboard.writeText(key.textContent.trim()).then(function () {
      button.textContent = "Copied";
    });
  });
});
