// A job's one best (its `best`: the schedule the lookup serves for its workload, confirmed or
// the best trial so far) as the jobs list and the job page show it.

import { el, fmtConfig, fmtGflops, isNum } from "./common.js";

export const UNCONFIRMED_TITLE =
  "The best trial so far: the job's end re-times the top few against each other to confirm the winner";

/** "304.9" and, until confirmed, a mark saying it is the best trial so far. */
export function bestGflops(best, { long = false } = {}) {
  if (!best || !isNum(best.gflops)) return ["\u2014"];
  const value = long ? `${fmtGflops(best.gflops)} GFLOP/s` : fmtGflops(best.gflops);
  if (best.confirmed) return [value];
  const text = long ? "best trial so far (unconfirmed)" : "unconfirmed";
  return [value, " ", el("span", { class: "unconfirmed", title: UNCONFIRMED_TITLE }, text)];
}

/** The least tie the lookup makes (tunehub.tuner.lookup.LIBRARY_TIE); a wider one is the
 * confirmation rounds' spread. */
const LIBRARY_TIE = 1.02;

/** "1.12× OpenBLAS 0.3.21", and below 1 or a tie, the lookup's advice (a tie wider than
 * LIBRARY_TIE: within the confirmation rounds' spread, which it names). */
export function speedupText(best) {
  if (!best || !isNum(best.speedup_vs_baseline)) return "\u2014";
  const library = best.library || "the library";
  const ratio = `${best.speedup_vs_baseline.toFixed(2)}\u00d7 ${library}`;
  if (!best.baseline_faster) return ratio;
  if (best.speedup_vs_baseline < 1) return `${ratio} (the library is faster)`;
  const tie = best.library_tie;
  const wider = isNum(tie) && tie > LIBRARY_TIE + 1e-9;
  const spread = wider ? ` within the rounds' ${((tie - 1) * 100).toFixed(1)}% spread` : "";
  return `${ratio} (a tie${spread}: use the library)`;
}

/** The speedup cell's class: faster, slower (or a tie), or none. */
export function speedupClass(best) {
  if (!best || !isNum(best.speedup_vs_baseline)) return "speedup";
  return `speedup ${best.baseline_faster ? "slower" : "faster"}`;
}

/** How the best was confirmed, or that it was not. */
export function confirmationText(best) {
  if (!best) return "\u2014";
  if (!best.confirmed) return "not yet: the best trial so far";
  const spread = isNum(best.confirmed_spread) ? `, spread ${(100 * best.confirmed_spread).toFixed(1)}%` : "";
  return `re-timed over ${best.confirmed_rounds} rounds against the runners-up${spread}`;
}

export function bestConfig(best) {
  return best ? `${best.template} ${fmtConfig(best.config)}` : "\u2014";
}
