// The link's page: runs with their status and progress, a chart of one run's metrics
// as its rounds finish, the nodes online. It reads the control API's JSON routes with
// the link's bearer token every POLL_MS, and each run's metrics from where it left off
// (after=N). Everything a run supplies is written as text (textContent), never markup.
"use strict";

(() => {
  const POLL_MS = 1500;
  const TOKEN_KEY = "fedcore-control-token";
  const SCOPES = ["server", "evaluate", "train"]; // fedcore.results.metrics.SCOPES
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  const runs = new Map(); // run id -> {run, after, header, rounds, complete}
  let token = null;
  let selected = null;
  let chosenByUser = false;
  let chosenMetric = null;
  let timer = null;

  class Refused extends Error {}

  // The token: from the address's fragment (then dropped from it), else this tab's storage.
  function takeToken() {
    const found = /(?:^|&)token=([^&]*)/.exec(location.hash.slice(1));
    if (found) {
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
      history.replaceState(null, "", location.pathname + location.search);
    }
    return sessionStorage.getItem(TOKEN_KEY);
  }

  async function call(path) {
    const answer = await fetch(path, {
      headers: { Authorization: `Bearer ${token}` },
      cache: "no-store",
      credentials: "omit",
    });
    if (!answer.ok) {
      let message = `${answer.status} ${answer.statusText}`;
      try {
        message = (await answer.json()).message || message;
      } catch (_) {
        // not a fedcore error document: the status says it
      }
      throw answer.status === 401 ? new Refused(message) : new Error(message);
    }
    return answer;
  }

  // A JSON line as Python writes it: a diverged loss is NaN (or Infinity), which
  // JSON.parse refuses; outside strings those read as null, and the chart skips them.
  function parseLine(text) {
    try {
      return JSON.parse(text);
    } catch (_) {
      let out = "";
      let inString = false;
      for (let i = 0; i < text.length; i += 1) {
        const c = text[i];
        if (inString) {
          out += c;
          if (c === "\\") {
            i += 1;
            out += text[i] ?? "";
          } else if (c === '"') {
            inString = false;
          }
          continue;
        }
        if (c === '"') {
          inString = true;
          out += c;
          continue;
        }
        const number = /^(-?Infinity|NaN)/.exec(text.slice(i, i + 9));
        if (number) {
          out += "null";
          i += number[0].length - 1;
          continue;
        }
        out += c;
      }
      return JSON.parse(out);
    }
  }

  async function readLines(path) {
    const lines = [];
    for (const text of (await (await call(path)).text()).split("\n")) {
      if (!text) continue;
      const line = parseLine(text);
      if (line.seq === undefined && line.error !== undefined) throw new Error(line.message);
      lines.push(line);
    }
    return lines;
  }

  async function readMetrics(entry) {
    // The run's status was read before its lines: a run finished then has them all now.
    const finished = entry.run.status.startsWith("finished:");
    const id = encodeURIComponent(entry.run.run_id);
    for (const line of await readLines(`/v1/runs/${id}/metrics?after=${entry.after}`)) {
      entry.after = line.seq;
      const document_ = line.document;
      if (typeof document_ !== "object" || document_ === null) continue;
      if ("round" in document_) entry.rounds.push(document_);
      else if ("run" in document_ && entry.header === null) entry.header = document_;
    }
    entry.complete = finished;
  }

  async function refresh() {
    const [health, listed, nodes] = await Promise.all(
      ["/v1/health", "/v1/runs", "/v1/nodes"].map(async (path) => (await call(path)).json()),
    );
    for (const run of listed.runs) {
      const known = runs.get(run.run_id);
      if (known) known.run = run;
      else runs.set(run.run_id, { run, after: 0, header: null, rounds: [], complete: false });
    }
    if (!chosenByUser || !runs.has(selected)) selected = newestRun(listed.runs);
    await Promise.all([...runs.values()].filter((entry) => !entry.complete).map(readMetrics));
    showHealth(health);
    showRuns(listed.runs);
    showChart();
    showNodes(nodes.nodes);
  }

  function newestRun(listed) {
    const going = listed.filter((run) => !run.status.startsWith("finished:"));
    const pick = going.length ? going : listed;
    return pick.length ? pick[pick.length - 1].run_id : null;
  }

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function progress(entry) {
    const last = entry.rounds[entry.rounds.length - 1];
    if (last) return `round ${last.round}/${last.num_rounds}`;
    return entry.header ? "started" : "";
  }

  function appName(entry) {
    return entry.header && typeof entry.header.app === "string" ? entry.header.app : "";
  }

  function showHealth(health) {
    $("health").textContent =
      `version ${health.version} · ${health.runs_active} runs active · ` +
      `${health.nodes_online} nodes online`;
  }

  function showRuns(listed) {
    const rows = [...listed].reverse().map((run) => {
      const entry = runs.get(run.run_id);
      const tr = document.createElement("tr");
      tr.dataset.runId = run.run_id;
      tr.dataset.status = run.status;
      if (run.run_id === selected) tr.className = "selected";
      const status = run.status.replace("finished:", "");
      tr.append(
        cell(run.run_id, "run-id"),
        cell(appName(entry)),
        cell(run.status, `status-${status}`),
        cell(progress(entry), "progress"),
        cell(run.reason, "reason"),
      );
      tr.addEventListener("click", () => {
        selected = run.run_id;
        chosenByUser = true;
        showRuns(listed);
        showChart();
      });
      return tr;
    });
    $("runs").tBodies[0].replaceChildren(...rows);
    $("no-runs").hidden = listed.length > 0;
  }

  function isNumber(value) {
    return typeof value === "number" && Number.isFinite(value);
  }

  function metricNames(rounds) {
    const names = [];
    for (const scope of SCOPES) {
      for (const row of rounds) {
        for (const [key, value] of Object.entries(row[scope] ?? {})) {
          const name = `${scope}.${key}`;
          if (isNumber(value) && !names.includes(name)) names.push(name);
        }
      }
    }
    return names;
  }

  function series(rounds, name) {
    const dot = name.indexOf(".");
    const scope = name.slice(0, dot);
    const key = name.slice(dot + 1);
    return rounds
      .filter((row) => isNumber((row[scope] ?? {})[key]))
      .map((row) => [row.round, row[scope][key]]);
  }

  function svg(tag, attributes, text) {
    const element = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value);
    if (text !== undefined) element.textContent = text;
    return element;
  }

  function label(value) {
    return Math.abs(value) >= 1e4 || (value !== 0 && Math.abs(value) < 1e-3)
      ? value.toExponential(2)
      : String(Number(value.toPrecision(4)));
  }

  function showChart() {
    const chart = $("chart");
    const entry = runs.get(selected);
    chart.replaceChildren();
    $("metric-choice").replaceChildren();
    if (!entry) {
      $("chart-title").textContent = "Metrics";
      $("chart-note").textContent = "";
      chart.dataset.points = "0";
      return;
    }
    const app = appName(entry);
    $("chart-title").textContent = `Metrics of run ${entry.run.run_id}${app ? ` (${app})` : ""}`;
    const names = metricNames(entry.rounds);
    if (!names.includes(chosenMetric)) chosenMetric = names[0] ?? null;
    for (const name of names) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = name;
      if (name === chosenMetric) button.className = "chosen";
      button.addEventListener("click", () => {
        chosenMetric = name;
        showChart();
      });
      $("metric-choice").append(button);
    }
    const points = chosenMetric ? series(entry.rounds, chosenMetric) : [];
    chart.dataset.points = String(points.length);
    chart.dataset.metric = chosenMetric ?? "";
    $("chart-note").textContent = points.length
      ? `${chosenMetric} over ${points.length} rounds`
      : "No round has finished with a metric yet.";
    if (!points.length) return;

    const [width, height, left, right, top, bottom] = [640, 320, 64, 16, 16, 40];
    const rounds = points.map(([round]) => round);
    const values = points.map(([, value]) => value);
    let [low, high] = [Math.min(...values), Math.max(...values)];
    if (low === high) [low, high] = [low - 1, high + 1];
    const [first, last] = [Math.min(...rounds), Math.max(...rounds)];
    const x = (round) =>
      left + (last === first ? 0.5 : (round - first) / (last - first)) * (width - left - right);
    const y = (value) => top + (1 - (value - low) / (high - low)) * (height - top - bottom);
    for (let i = 0; i <= 4; i += 1) {
      const value = low + ((high - low) * i) / 4;
      chart.append(
        svg("line", { class: "grid", x1: left, x2: width - right, y1: y(value), y2: y(value) }),
        svg("text", { x: left - 6, y: y(value) + 4, "text-anchor": "end" }, label(value)),
      );
    }
    chart.append(
      svg("line", { class: "axis", x1: left, x2: width - right, y1: height - bottom, y2: height - bottom }),
      svg("text", { x: x(first), y: height - bottom + 16, "text-anchor": "middle" }, `round ${first}`),
    );
    if (last !== first) {
      chart.append(
        svg("text", { x: x(last), y: height - bottom + 16, "text-anchor": "middle" }, `${last}`),
      );
    }
    const path = points.map(([round, value]) => `${x(round)},${y(value)}`).join(" ");
    chart.append(svg("polyline", { class: "line", points: path }));
    for (const [round, value] of points) {
      const point = svg("circle", { class: "point", cx: x(round), cy: y(value), r: 3.5 });
      point.dataset.round = String(round);
      point.append(svg("title", {}, `round ${round}: ${value}`));
      chart.append(point);
    }
  }

  function showNodes(nodes) {
    $("node-count").textContent = String(nodes.length);
    $("nodes").replaceChildren(
      ...nodes.map((node) => {
        const li = document.createElement("li");
        li.textContent = node.node_id;
        return li;
      }),
    );
  }

  async function poll() {
    try {
      await refresh();
      $("error").textContent = "";
    } catch (error) {
      if (error instanceof Refused) {
        signOut(`The link refused the token: ${error.message}`);
        return;
      }
      $("error").textContent = `Cannot read the link: ${error.message}`;
    }
    timer = setTimeout(poll, POLL_MS);
  }

  function signIn(given) {
    token = given;
    runs.clear();
    $("login").hidden = true;
    $("main").hidden = false;
    $("logout").hidden = false;
    clearTimeout(timer);
    poll();
  }

  function signOut(why) {
    clearTimeout(timer);
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    $("main").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = why;
  }

  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const given = $("token").value.trim();
    $("token").value = "";
    if (!given) return;
    sessionStorage.setItem(TOKEN_KEY, given);
    signIn(given);
  });
  $("logout").addEventListener("click", () => signOut(""));

  const found = takeToken();
  if (found) signIn(found);
  else signOut("");
})();
