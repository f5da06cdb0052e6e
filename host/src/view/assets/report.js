// The view of one run: the page `mst report` writes and the run page of `mst serve` both call
// `MstReport.render(root, view, loadTrace)`. `view` is the `mst.view/v1` data (see
// host/src/view/mod.rs); `loadTrace(index)` resolves to the trace of the index-th planned trial,
// or null; `opts.hashPrefix` is what comes between `#` and `trial-N` in a trial's link (the web
// UI routes by hash). Every text from the run goes in as text (never as markup): traces are
// hostile.
'use strict';
var MstReport = (function () {
  var PAGE = 100;
  var TRIAL_OUTCOMES = ['passed', 'failed', 'not-graded', 'infra', 'missing'];
  var LABEL = {
    passed: 'passed', failed: 'failed', 'not-graded': 'not graded', infra: 'infra',
    missing: 'missing', incomplete: 'incomplete'
  };
  var MARK = {
    passed: '\u2713', failed: '\u2717', 'not-graded': '?', infra: '\u26a0', missing: '\u2205',
    incomplete: '\u2026'
  };

  // An element: attributes (`on*` are listeners), then children (strings become text nodes).
  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === undefined || v === null || v === false) return;
        if (k.slice(0, 2) === 'on') el.addEventListener(k.slice(2), v);
        else el.setAttribute(k, v === true ? '' : String(v));
      });
    }
    for (var i = 2; i < arguments.length; i++) append(el, arguments[i]);
    return el;
  }
  function append(el, child) {
    if (child === undefined || child === null || child === false) return;
    if (Array.isArray(child)) child.forEach(function (c) { append(el, c); });
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
  // Run data names things (case ids, variants, causes) that may be called `constructor` or
  // `__proto__`: every map keyed by them has no prototype (`map()`), and every lookup into an
  // object read from the run asks for the object's own member only (`own`).
  function map() { return Object.create(null); }
  function own(object, key) {
    return object && Object.prototype.hasOwnProperty.call(object, key) ? object[key] : undefined;
  }
  // An outcome's mark, word and colour (`label` instead of the outcome's own word).
  function badge(outcome, label) {
    return h('span', { 'class': 'badge o-' + outcome, 'data-outcome': outcome },
      (own(MARK, outcome) || '') + ' ' + (label || own(LABEL, outcome) || outcome));
  }
  function rate(r) { return r === null || r === undefined ? '\u2013' : (r * 100).toFixed(1) + '%'; }
  function json(v) { return JSON.stringify(v, null, 2); }
  function when(secs) { return secs ? new Date(secs * 1000).toISOString().replace('.000Z', 'Z') : '\u2013'; }
  function ms(v) { return v === undefined || v === null ? '\u2013' : v < 1000 ? v + ' ms' : (v / 1000).toFixed(2) + ' s'; }
  function facts(pairs) {
    var dl = h('dl', { 'class': 'facts' });
    pairs.forEach(function (p) {
      if (p[1] === undefined || p[1] === null || p[1] === '') return;
      dl.appendChild(h('dt', null, p[0]));
      dl.appendChild(h('dd', null, p[1]));
    });
    return dl;
  }
  function table(caption, heads, rows, attrs) {
    var t = h('table', attrs || null, caption ? h('caption', null, caption) : null,
      h('thead', null, h('tr', null, heads.map(function (x) {
        return typeof x === 'string' ? h('th', { scope: 'col' }, x) : x;
      }))),
      h('tbody', null, rows));
    return h('div', { 'class': 'table-wrap' }, t);
  }
  function num(key, value, extra) {
    var attrs = { 'class': 'num', 'data-count': key };
    if (extra !== undefined) attrs['data-value'] = extra;
    return h('td', attrs, value);
  }

  // --- sections -------------------------------------------------------------------------------

  function header(view) {
    var run = view.run, s = view.summary;
    return h('header', null,
      h('h1', null, 'Run ', run.runId, ' of ', run.eval),
      h('p', { 'class': 'meta' }, 'created ', when(run.createdAt), ' \u00b7 runner ', run.runner,
        s.unsandboxed ? h('span', { 'class': 'unsandboxed' }, ' \u00b7 unsandboxed: its agents ran as the operator') : '',
        ' \u00b7 collect ', s.collect, ' \u00b7 grade ', s.grade,
        ' \u00b7 ', h('span', { 'data-count': 'trials' }, String(view.trials.length)), ' trials planned',
        ' \u00b7 mst ', run.mst),
      (run.workspaces || []).length ? h('p', { 'class': 'meta workspaces' }, 'workspaces: ',
        run.workspaces.map(function (w) {
          return w.digest.slice(0, 19) + '\u2026 from ' + w.source +
            (w.commit ? ' at ' + w.commit.slice(0, 12) : '') + ' (' + w.files + ' files)';
        }).join('; ')) : '');
  }

  // `+25.0 pp [13.7, 35.2], p < 0.001` (as the terminal prints a comparison).
  function compared(c) {
    if (!c) return '\u2013';
    var pp = function (x) { return (x * 100).toFixed(1); };
    var p = c.pValue < 0.001 ? 'p < 0.001' : 'p = ' + c.pValue.toFixed(3);
    return (c.delta >= 0 ? '+' : '') + pp(c.delta) + ' pp [' + pp(c.deltaCi[0]) + ', ' + pp(c.deltaCi[1]) + '], ' + p +
      (c.significant ? '' : ', not significant');
  }
  function passAtK(v) {
    var ks = Object.keys(v.passAtK || {});
    if (!ks.length) return '\u2013';
    return ks.map(function (k) { return 'pass@' + k + ' ' + rate(v.passAtK[k]); }).join(' \u00b7 ') +
      (v.flaky !== undefined ? ' \u00b7 flaky ' + rate(v.flaky) : '');
  }

  function variantsSection(view) {
    var s = view.summary, usage = (s.usage && s.usage.variants) || {};
    var comparisons = s.comparisons || {};
    var baseline = Object.keys(comparisons).length ? comparisons[Object.keys(comparisons)[0]].baseline : null;
    var anyAtK = Object.keys(s.variants).some(function (n) { return Object.keys(s.variants[n].passAtK || {}).length; });
    var rows = Object.keys(s.variants).map(function (name) {
      var v = s.variants[name], u = own(usage, name), ci = v.passRateCi;
      return h('tr', { 'data-variant': name },
        h('th', { scope: 'row' }, name, s.baseline === name ? ' (baseline)' : ''),
        num('pass-rate', rate(v.passRate), v.passRate === null ? '' : v.passRate),
        num('pass-rate-ci', ci ? '[' + (ci[0] * 100).toFixed(1) + ', ' + (ci[1] * 100).toFixed(1) + ']' : '\u2013'),
        baseline ? h('td', { 'data-count': 'compared' }, name === baseline ? 'baseline' : compared(comparisons[name])) : null,
        anyAtK ? h('td', { 'data-count': 'pass-at-k' }, passAtK(v)) : null,
        num('of-planned', v.passed + '/' + (v.passed + v.failed + v.incomplete + v.notGraded + v.infra)),
        num('passed', v.passed), num('failed', v.failed), num('incomplete', v.incomplete),
        num('not-graded', v.notGraded), num('infra', v.infra),
        num('cost', u && u.costUsd !== undefined ? '$' + u.costUsd.toFixed(4) : '\u2013'),
        num('tokens', u ? (u.inputTokens + u.outputTokens).toLocaleString('en') : '\u2013'));
    });
    var heads = ['Variant', 'Pass rate', '95% CI'].concat(baseline ? ['Against ' + baseline] : [],
      anyAtK ? ['pass@k'] : [], ['Of planned', MARK.passed + ' Passed', MARK.failed + ' Failed',
      MARK.incomplete + ' Incomplete', '? Not graded', MARK.infra + ' Infra', 'Cost', 'Tokens']);
    return h('section', { id: 'variants', 'aria-labelledby': 'variants-h' },
      h('h2', { id: 'variants-h' }, 'Variants'),
      table('Cases per outcome. The pass rate is passed / (passed + failed): incomplete, ' +
        'not-graded and infra cases are left out; "of planned" counts them all.', heads, rows),
      h('p', null, h('span', { 'class': 'badge o-missing' }, MARK.missing), ' ',
        h('span', { 'data-count': 'missing' }, String(s.missing.length)),
        ' trials missing (their trace never came back)'),
      (s.usage && s.usage.plugins && Object.keys(s.usage.plugins).length) ?
        table('Model use by plugins while grading', ['Plugin', 'Calls', 'Tokens in', 'Tokens out', 'Cost'],
          Object.keys(s.usage.plugins).map(function (p) {
            var u = s.usage.plugins[p];
            return h('tr', null, h('th', { scope: 'row' }, p), num('calls', u.calls),
              num('in', u.inputTokens), num('out', u.outputTokens),
              num('cost', u.costUsd !== undefined ? '$' + u.costUsd.toFixed(4) : '\u2013'));
          })) : null);
  }

  // The charts mst drew (inline SVG): a report file carries them as static markup, which is
  // moved here; a served view carries the same markup, drawn by the server, in `charts`.
  function chartsSection(view) {
    var section = document.getElementById('mst-charts');
    if (section) return section;
    if (!view.charts) return null;
    section = h('section', { id: 'mst-charts', 'class': 'charts', 'aria-labelledby': 'charts-h' },
      h('h2', { id: 'charts-h' }, 'Charts'));
    var holder = document.createElement('div');
    holder.innerHTML = view.charts; // SVG markup from mst itself, every text in it escaped
    while (holder.firstChild) section.appendChild(holder.firstChild);
    return section;
  }

  // Each MCP server's health over the run, and the tools each variant's clients were shown
  // (run.json's toolLists: renamed, rewritten or dry-run-blocked tools marked).
  function serversSection(view) {
    var servers = view.summary.servers || {}, lists = view.run.toolLists || {};
    var labels = Object.keys(servers), variants = Object.keys(lists);
    if (!labels.length && !variants.length) return null;
    var health = labels.length ? table('Calls to each MCP server, as the trials made them',
      ['Server', 'Calls', 'Errors', 'Blocked', 'p50', 'p95', 'Never called'], labels.map(function (label) {
        var x = servers[label];
        return h('tr', { 'data-server': label }, h('th', { scope: 'row' }, label),
          num('calls', x.calls), num('errors', x.errors), num('blocked', x.blocked || 0),
          num('p50', ms(x.p50Ms)), num('p95', ms(x.p95Ms)),
          h('td', { 'data-count': 'never-called' }, (x.neverCalled || []).join(', ') || '\u2013'));
      })) : null;
    var shown = variants.map(function (variant) {
      var rows = [];
      Object.keys(lists[variant]).forEach(function (label) {
        lists[variant][label].forEach(function (tool) {
          var notes = [];
          if (tool.renamedFrom) notes.push('renamed from ' + tool.renamedFrom);
          if (tool.schemaRewritten) notes.push('input schema rewritten');
          if (tool.blocked) notes.push(tool.blocked);
          rows.push(h('tr', { 'data-tool': label + '__' + tool.name }, h('th', { scope: 'row' }, label),
            h('td', null, h('code', null, tool.name)), h('td', null, tool.description),
            h('td', { 'data-count': 'notes' }, notes.join('; '))));
        });
      });
      return h('details', { 'data-variant': variant }, h('summary', null, variant, ': ', String(rows.length), ' tools shown'),
        table(null, ['Server', 'Tool', 'Description', 'Notes'], rows));
    });
    return h('section', { id: 'servers', 'aria-labelledby': 'servers-h' },
      h('h2', { id: 'servers-h' }, 'MCP servers'), health,
      variants.length ? h('div', { id: 'tool-lists' }, h('h3', null, 'Tools each variant was shown'), shown) : null);
  }

  // Infrastructure failures grouped by cause: one broken runner is one line with a big count.
  function infraSection(view, state) {
    var groups = map();
    view.trials.forEach(function (t) {
      if (t.outcome !== 'infra') return;
      var cause = (t.cause || 'no cause recorded').split('\n')[0].slice(0, 300);
      var g = groups[cause] || (groups[cause] = { cause: cause, count: 0, variants: map() });
      g.count++;
      g.variants[t.variant] = true;
    });
    var list = Object.keys(groups).map(function (k) { return groups[k]; })
      .sort(function (a, b) { return b.count - a.count; });
    if (!list.length) return null;
    return h('section', { id: 'infra', 'aria-labelledby': 'infra-h' },
      h('h2', { id: 'infra-h' }, MARK.infra + ' Infrastructure failures by cause'),
      h('ul', null, list.map(function (g) {
        return h('li', { 'data-cause': g.cause },
          h('strong', { 'data-count': 'infra-trials' }, String(g.count)), g.count === 1 ? ' trial' : ' trials',
          ' (', Object.keys(g.variants).join(', '), '): ',
          h('code', null, g.cause), ' ',
          h('button', { type: 'button', onclick: function () { state.show({ outcome: 'infra', search: g.cause }); } },
            'show'));
      })));
  }

  function diffSection(view) {
    var d = view.diff;
    if (!d) return null;
    var entries = d.cases || [];
    var order = ['broke', 'fixed', 'flaky', 'still-failing', 'added', 'removed'];
    var byChange = map();
    entries.forEach(function (e) { (byChange[e.change] = byChange[e.change] || []).push(e); });
    function side(s) {
      if (!s) return '\u2013';
      return [badge(s.outcome), s.trials !== undefined ? ' ' + s.passedTrials + '/' + s.trials : ''];
    }
    return h('section', { id: 'diff', 'aria-labelledby': 'diff-h' },
      h('h2', { id: 'diff-h' }, 'Compared with run ', d.before.runId),
      d.datasetsDiffer ? h('p', { 'class': 'notice' }, 'The two runs used different datasets.') : null,
      table('Pass rate per variant', ['Variant', 'Before', 'After', 'Change'],
        d.variants.map(function (x) {
          var v = x.variant;
          return h('tr', { 'data-variant': v }, h('th', { scope: 'row' }, v),
            num('before', rate(x.before)), num('after', rate(x.after)),
            num('delta', x.delta === null || x.delta === undefined ? '\u2013' :
              (x.delta >= 0 ? '+' : '') + (x.delta * 100).toFixed(1) + ' pts'));
        })),
      order.filter(function (c) { return byChange[c]; }).map(function (c) {
        return h('details', { open: c === 'broke' || c === 'fixed', 'data-change': c },
          h('summary', null, c.replace('-', ' '), ': ', h('span', { 'data-count': c }, String(byChange[c].length))),
          table(null, ['Variant', 'Case', 'Before', 'After'], byChange[c].map(function (e) {
            return h('tr', null, h('td', null, e.variant), h('td', null, e.case),
              h('td', null, side(e.before)), h('td', null, side(e.after)));
          })));
      }));
  }

  function pairsSection(view) {
    var pairs = view.summary.pairs || [];
    if (!pairs.length) return null;
    var details = map();
    (view.pairs || []).forEach(function (p) { details[p.name] = p; });
    return h('section', { id: 'pairs', 'aria-labelledby': 'pairs-h' },
      h('h2', { id: 'pairs-h' }, 'Pairwise verdicts'),
      table('Counted for variant a: a win is a case both orders gave to a.',
        ['Judge', 'a', 'b', 'Wins', 'Ties', 'Losses', 'Not graded', 'Not compared'],
        pairs.map(function (p) {
          return h('tr', { 'data-pair': p.name }, h('th', { scope: 'row' }, p.name),
            h('td', null, p.a), h('td', null, p.b), num('wins', p.wins), num('ties', p.ties),
            num('losses', p.losses), num('not-graded', p.notGraded), num('not-compared', p.notCompared));
        })),
      pairs.map(function (p) {
        var d = details[p.name];
        if (!d) return null;
        return h('details', null, h('summary', null, p.name, ': verdicts per case'),
          table(null, ['Case', 'Outcome', 'Why'], d.cases.map(function (c) {
            var why = c.reason || (c.orders || []).map(function (o) {
              return o.first + ' then ' + o.second + ': ' + (o.winner || 'no verdict') +
                (o.reason ? ' \u2014 ' + o.reason : '') + (o.error ? ' (error: ' + o.error + ')' : '');
            }).join('\n');
            return h('tr', null, h('td', null, c.case), h('td', null, c.outcome), h('td', null, h('pre', null, why)));
          })));
      }));
  }

  function provenanceSection(view) {
    var r = view.run;
    var git = r.git ? r.git.commit + (r.git.dirty ? ' (dirty)' : '') + (r.git.origin ? ' ' + r.git.origin : '') : null;
    var options = Object.keys(r.runnerOptions || {}).map(function (k) { return k + '=' + r.runnerOptions[k]; }).join(', ');
    return h('section', { id: 'provenance', 'aria-labelledby': 'provenance-h' },
      h('h2', { id: 'provenance-h' }, 'Provenance'),
      facts([['Run', r.runId], ['Eval', r.eval], ['Created', when(r.createdAt)], ['mst', r.mst],
        ['Config', r.configPath], ['Config sha256', r.configHash], ['Dataset sha256', r.datasetHash],
        ['Git', git], ['Runner', r.runner + (options ? ' (' + options + ')' : '')], ['Shards', r.shards],
        ['Baseline variant', r.baseline], ['Collect', r.collect], ['Grade', r.grade]]),
      (r.plugins && r.plugins.length) ? table('Plugins, with what each declared and was granted',
        ['Plugin', 'Kind', 'Digest', 'Granted'], r.plugins.map(function (p) {
          return h('tr', { 'data-plugin': p.name }, h('th', { scope: 'row' }, p.name + ' ' + p.version),
            h('td', null, p.kind), h('td', null, h('code', null, p.digest)),
            h('td', null, h('pre', null, json(p.granted))));
        })) : null,
      (r.machines && r.machines.length) ? h('details', null,
        h('summary', null, 'Machines (', String(r.machines.length), ')'),
        h('pre', null, json(r.machines))) : null,
      r.filters ? h('details', null, h('summary', null, 'Filters'), h('pre', null, json(r.filters))) : null);
  }

  // --- the trials and cases, filtered and paged -----------------------------------------------

  function matches(t, f) {
    if (f.outcome && t.outcome !== f.outcome) return false;
    if (f.variant && t.variant !== f.variant) return false;
    if (f.tag && (t.tags || []).indexOf(f.tag) < 0) return false;
    if (f.judge && !(t.judges || []).some(function (j) { return j.judge === f.judge; })) return false;
    if (f.search) {
      var q = f.search.toLowerCase();
      var hay = t.case + '\n' + (t.cause || '') + '\n' +
        (t.judges || []).map(function (j) { return j.judge + ' ' + j.reason; }).join('\n');
      if (hay.toLowerCase().indexOf(q) < 0) return false;
    }
    return true;
  }

  function options(values, all) {
    return [h('option', { value: '' }, all)].concat(values.map(function (v) {
      return h('option', { value: v }, own(LABEL, v) || v);
    }));
  }

  function unique(list) {
    var seen = map(), out = [];
    list.forEach(function (x) { if (!seen[x]) { seen[x] = true; out.push(x); } });
    return out.sort();
  }

  function pager(id, state, total, onMove) {
    var start = state.page * PAGE;
    return h('div', { 'class': 'pager', id: id },
      h('button', { type: 'button', disabled: state.page === 0, onclick: function () { onMove(-1); } }, 'Previous'),
      h('span', { 'aria-live': 'polite' }, total ? (start + 1) + '\u2013' + Math.min(start + PAGE, total) + ' of ' + total : 'none match'),
      h('button', { type: 'button', disabled: start + PAGE >= total, onclick: function () { onMove(1); } }, 'Next'));
  }

  function render(root, view, loadTrace, opts) {
    opts = opts || {};
    var prefix = opts.hashPrefix || '';
    while (root.firstChild) root.removeChild(root.firstChild);
    if (!view || view.format !== 'mst.view/v1') {
      root.appendChild(h('p', { 'class': 'notice error' }, 'This page reads mst.view/v1 data; it got ',
        view && view.format ? view.format : 'something else', '. Use the mst that wrote it.'));
      return;
    }
    var variants = Object.keys(view.summary.variants);
    var judges = unique([].concat.apply([], view.trials.map(function (t) {
      return (t.judges || []).map(function (j) { return j.judge; });
    })));
    var tags = unique([].concat.apply([], view.trials.map(function (t) { return t.tags || []; })));
    var filter = { outcome: '', variant: '', tag: '', judge: '', search: '' };
    var trialsState = { page: 0 }, casesState = { page: 0 };
    var state = {
      show: function (f) {
        Object.keys(filter).forEach(function (k) { filter[k] = f[k] || ''; });
        syncControls();
        refresh();
        document.getElementById('trials-h').scrollIntoView();
      }
    };

    var controls = {
      outcome: h('select', { id: 'filter-outcome' }, options(TRIAL_OUTCOMES, 'every outcome')),
      variant: h('select', { id: 'filter-variant' }, options(variants, 'every variant')),
      tag: h('select', { id: 'filter-tag', disabled: !tags.length }, options(tags, 'every tag')),
      judge: h('select', { id: 'filter-judge', disabled: !judges.length }, options(judges, 'every judge')),
      search: h('input', { id: 'search', type: 'search', placeholder: 'case, reason or cause' })
    };
    function syncControls() { Object.keys(controls).forEach(function (k) { controls[k].value = filter[k]; }); }
    Object.keys(controls).forEach(function (k) {
      controls[k].addEventListener(k === 'search' ? 'input' : 'change', function () {
        filter[k] = controls[k].value;
        trialsState.page = 0; casesState.page = 0;
        refresh();
      });
    });
    var filters = h('div', { 'class': 'filters', role: 'search' },
      h('label', null, 'Outcome', controls.outcome), h('label', null, 'Variant', controls.variant),
      h('label', null, 'Tag', controls.tag), h('label', null, 'Judge', controls.judge),
      h('label', null, 'Search', controls.search));

    var casesBox = h('div', null), trialsBox = h('div', null);
    var tracePanel = h('section', { id: 'trace', hidden: true, 'aria-labelledby': 'trace-h', tabindex: '-1' });

    function refresh() { drawCases(); drawTrials(); }

    function drawTrials() {
      var shown = [];
      view.trials.forEach(function (t, i) { if (matches(t, filter)) shown.push(i); });
      var start = trialsState.page * PAGE;
      var rows = shown.slice(start, start + PAGE).map(function (i) {
        var t = view.trials[i];
        var first = (t.judges || []).filter(function (j) { return !j.pass; })[0] || (t.judges || [])[0];
        var why = t.cause || (first ? first.judge + ': ' + first.reason : '');
        return h('tr', { 'data-trial-index': i, 'class': i === opts.selected ? 'selected' : null },
          h('td', null, h('a', { href: '#' + prefix + 'trial-' + i, 'class': 'open-trial' }, t.case)),
          h('td', null, t.variant), h('td', { 'class': 'num' }, t.trial),
          h('td', null, badge(t.outcome)),
          h('td', { 'class': 'num' }, t.score === undefined ? '\u2013' : t.score.toFixed(2)),
          h('td', null, why), h('td', { 'class': 'num' }, ms(t.durationMs)));
      });
      var box = h('div', null,
        table('Trials matching the filters (' + shown.length + ' of ' + view.trials.length + ')',
          ['Case', 'Variant', 'Trial', 'Outcome', 'Score', 'First failing judge or cause', 'Time'], rows,
          { id: 'trials-table' }),
        pager('trials-pager', trialsState, shown.length, function (d) { trialsState.page += d; drawTrials(); }));
      trialsBox.replaceWith(box);
      trialsBox = box;
    }

    // Each case's outcome per variant side by side, as summary.json's `cases` holds them.
    function drawCases() {
      var perCase = map();
      view.trials.forEach(function (t) {
        var c = perCase[t.case] || (perCase[t.case] = { any: false, v: map() });
        var cell = c.v[t.variant] || (c.v[t.variant] = { passed: 0, trials: 0 });
        cell.trials++;
        if (t.outcome === 'passed') cell.passed++;
        if (matches(t, filter)) c.any = true;
      });
      var names = Object.keys(perCase).filter(function (c) { return perCase[c].any; });
      var start = casesState.page * PAGE;
      var rows = names.slice(start, start + PAGE).map(function (c) {
        return h('tr', { 'data-case': c },
          h('th', { scope: 'row' }, h('a', {
            href: '#', onclick: function (e) { e.preventDefault(); state.show({ search: c }); }
          }, c)),
          variants.map(function (v) {
            var outcome = own(own(view.summary.cases, v), c), cell = perCase[c].v[v];
            return h('td', { 'data-variant': v }, outcome ? badge(outcome) : '\u2013',
              cell ? ' ' + cell.passed + '/' + cell.trials : '');
          }));
      });
      var box = h('div', null,
        table('Each case per variant: its outcome, and trials passed / planned (' + names.length + ' cases)',
          ['Case'].concat(variants), rows, { id: 'cases-table' }),
        pager('cases-pager', casesState, names.length, function (d) { casesState.page += d; drawCases(); }));
      casesBox.replaceWith(box);
      casesBox = box;
    }

    function openTrial(i) {
      var t = view.trials[i];
      if (!t) return;
      opts.selected = i;
      while (tracePanel.firstChild) tracePanel.removeChild(tracePanel.firstChild);
      tracePanel.hidden = false;
      tracePanel.appendChild(h('h3', { id: 'trace-h' }, t.variant, ' / ', t.case, ' / trial ', String(t.trial)));
      tracePanel.appendChild(h('button', { type: 'button', onclick: function () { tracePanel.hidden = true; history.replaceState(null, '', '#' + prefix); } }, 'Close'));
      tracePanel.appendChild(facts([['Outcome', badge(t.outcome)],
        ['Score', t.score === undefined ? null : t.score.toFixed(3)], ['Cause', t.cause],
        ['Exit code', t.exitCode], ['Duration', ms(t.durationMs)], ['Events', t.events]]));
      if ((t.judges || []).length) {
        tracePanel.appendChild(table('Judges', ['Judge', 'Score', 'Pass', 'Reason'], t.judges.map(function (j) {
          return h('tr', { 'data-judge': j.judge }, h('th', { scope: 'row' }, j.judge), num('score', j.value.toFixed(3)),
            h('td', null, badge(j.pass ? 'passed' : 'failed')), h('td', null, h('pre', null, j.reason)));
        })));
      }
      var body = h('div', null, h('p', { 'class': 'meta' }, 'Loading the trace\u2026'));
      tracePanel.appendChild(body);
      tracePanel.focus();
      Promise.resolve(t.hasTrace ? loadTrace(i) : null).then(function (record) {
        body.replaceWith(traceBody(record));
      }, function (e) {
        body.replaceWith(h('p', { 'class': 'notice error' }, 'The trace could not be loaded: ', String(e)));
      });
      drawTrials();
    }

    root.appendChild(h('div', null, header(view), variantsSection(view), chartsSection(view), serversSection(view), infraSection(view, state),
      diffSection(view), pairsSection(view),
      h('section', { id: 'cases', 'aria-labelledby': 'cases-h' }, h('h2', { id: 'cases-h' }, 'Cases'), filters, casesBox),
      h('section', { id: 'trials', 'aria-labelledby': 'trials-h' }, h('h2', { id: 'trials-h' }, 'Trials'), tracePanel, trialsBox),
      provenanceSection(view)));
    refresh();
    function fromHash() {
      if (!root.isConnected) { window.removeEventListener('hashchange', fromHash); return; }
      var hash = location.hash.slice(1);
      if (hash.slice(0, prefix.length) !== prefix) return;
      var m = /^trial-(\d+)$/.exec(hash.slice(prefix.length));
      if (m) openTrial(Number(m[1]));
    }
    window.addEventListener('hashchange', fromHash);
    fromHash();
    document.body.dataset.ready = '1';
  }

  function eventItem(e) {
    var head = h('div', { 'class': 'event-head' }, '#' + e.seq + ' at ' + ms(e.atMs) + ' \u00b7 ' + e.type);
    var li = h('li', { 'data-event-kind': e.type, 'class': e.type === 'tool-result' && e.isError ? 'error' : null }, head);
    switch (e.type) {
      case 'message': append(head, ' \u00b7 ' + e.role); li.appendChild(h('pre', null, e.text)); break;
      case 'tool-call':
        append(head, ' \u00b7 ' + (e.server ? e.server + '/' : '') + e.tool + ' (' + e.id + ')');
        li.appendChild(h('pre', null, json(e.arguments)));
        break;
      case 'tool-result':
        append(head, ' \u00b7 ' + e.id + (e.isError ? ' \u00b7 error' : '') + ' \u00b7 ' + ms(e.durationMs));
        li.appendChild(h('pre', null, e.output));
        break;
      case 'log': li.appendChild(h('pre', null, e.text)); break;
      default: append(head, ' \u00b7 ' + (e.name || '')); li.appendChild(h('pre', null, json(e.data)));
    }
    return li;
  }

  // A trial's whole trace: its case, its answer, every event in order.
  function traceBody(record) {
    if (!record) return h('p', { 'class': 'notice' }, 'No trace came back for this trial.');
    var tr = record.trace || {};
    return h('div', null,
      facts([['Status', tr.status], ['Collected by', record.collectedBy ?
        'shard ' + record.collectedBy.shard + ' on ' + record.collectedBy.machine + ' (' +
        record.collectedBy.client + ' ' + record.collectedBy.clientVersion + ')' : null]]),
      h('details', null, h('summary', null, 'Case input'), h('pre', null, json(record.case.input))),
      record.case.expected !== undefined ? h('details', null, h('summary', null, 'Expected'), h('pre', null, json(record.case.expected))) : null,
      h('h3', null, 'Final answer'),
      tr.finalText !== undefined ? h('pre', { id: 'final-text' }, tr.finalText) : h('p', { 'class': 'meta' }, 'none'),
      h('h3', null, 'Events (', String((tr.events || []).length), ')'),
      h('ol', { 'class': 'events' }, (tr.events || []).map(eventItem)));
  }

  return { render: render, h: h, badge: badge, eventItem: eventItem, traceBody: traceBody, rate: rate };
})();
