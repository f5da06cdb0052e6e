// The web UI of `mst serve` (and `mst run --serve`): routes by hash, talks only to this server's
// API (docs/serve.md), draws stored runs with the report's own script. Open the page once with the
// access token in its fragment (`/#token=TOKEN`, or `/#/runs/ID&token=TOKEN`): the token is kept
// in this tab's session storage and sent as `Authorization: Bearer` (a fragment never reaches a
// server or its logs), and the route stays.
'use strict';
(function () {
  var h = MstReport.h, badge = MstReport.badge;
  var app = document.getElementById('app');
  var timers = [];

  var token = sessionStorage.getItem('mst-token');
  // Takes the token out of the fragment, on load and on every route change (a link with a
  // token followed in an open tab changes the fragment only).
  function takeToken() {
    var m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (!m) return;
    token = decodeURIComponent(m[1]);
    sessionStorage.setItem('mst-token', token);
    var rest = location.hash.replace(/(?:^#|&)token=[^&]+/, '').replace(/^#?&?/, '#');
    history.replaceState(null, '', location.pathname + (rest.length > 1 ? rest : '#/runs'));
  }
  takeToken();

  // One API call: resolves to the JSON body of a 2xx answer; rejects with an Error carrying the
  // answer's `error` text and its `status`.
  function api(method, path, body) {
    var headers = {};
    if (token) headers.Authorization = 'Bearer ' + token;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    return fetch(path, { method: method, headers: headers, body: body === undefined ? undefined : JSON.stringify(body) })
      .then(function (r) {
        return r.text().then(function (text) {
          var data = null;
          try { data = text ? JSON.parse(text) : null; } catch (e) { data = { error: text }; }
          if (r.ok) return data;
          var error = new Error((data && data.error) || ('HTTP ' + r.status));
          error.status = r.status;
          throw error;
        });
      });
  }

  function later(fn, ms) { timers.push(setTimeout(fn, ms)); }
  function page(title) {
    timers.forEach(clearTimeout);
    timers = [];
    while (app.firstChild) app.removeChild(app.firstChild);
    document.title = title + ' \u00b7 mst';
    var box = h('div', null);
    app.appendChild(box);
    return box;
  }
  function failure(box, what, e) {
    box.appendChild(h('p', { 'class': 'notice error', role: 'alert' }, what, ': ', e.message));
  }
  function when(secs) { return secs ? new Date(secs * 1000).toISOString().replace('.000Z', 'Z') : '\u2013'; }
  function markNav(which) {
    ['runs', 'playground'].forEach(function (n) {
      var a = document.getElementById('nav-' + n);
      if (n === which) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    });
  }

  // --- runs ------------------------------------------------------------------------------------

  function runsPage() {
    markNav('runs');
    var box = page('Runs');
    box.appendChild(h('h1', null, 'Runs'));
    Promise.all([api('GET', '/api/v1/info'), api('GET', '/api/v1/runs')]).then(function (r) {
      var info = r[0], list = r[1];
      if (info.canStartRuns) {
        var status = h('span', { id: 'start-status', role: 'status' });
        var button = h('button', {
          type: 'button', id: 'start-run', 'class': 'primary', onclick: function () {
            button.disabled = true;
            status.textContent = ' starting\u2026';
            api('POST', '/api/v1/runs', {}).then(function (state) {
              location.hash = '#/runs/' + encodeURIComponent(state.runId);
            }, function (e) { button.disabled = false; status.textContent = ' ' + e.message; });
          }
        }, 'Start a run of ', info.playground ? info.playground.eval : 'the eval');
        box.appendChild(h('p', null, button, status));
      }
      var live = list.live.filter(function (l) { return !l.done && l.runId; });
      if (live.length) {
        box.appendChild(h('h2', null, 'Running'));
        box.appendChild(h('ul', { id: 'live-runs' }, live.map(function (l) {
          return h('li', null, h('a', { href: '#/runs/' + encodeURIComponent(l.runId) }, l.runId),
            ' ', l.collected + l.infra, ' of ', l.total, ' trials');
        })));
      }
      if ((list.trends || []).length) {
        box.appendChild(h('h2', null, 'Pass rate over runs'));
        var trends = h('div', { id: 'trends', 'class': 'charts' });
        list.trends.forEach(function (t) {
          var holder = document.createElement('div');
          holder.innerHTML = t.svg; // SVG markup drawn by mst, every text in it escaped
          while (holder.firstChild) trends.appendChild(holder.firstChild);
        });
        box.appendChild(trends);
      }
      box.appendChild(h('h2', null, 'Stored runs and sessions'));
      if (!list.runs.length) { box.appendChild(h('p', null, 'No run is stored yet.')); return; }
      box.appendChild(h('div', { 'class': 'table-wrap' }, h('table', { id: 'runs-table' },
        h('caption', null, 'Newest first, with the playground sessions'),
        h('thead', null, h('tr', null, ['Run', 'Eval', 'Created', 'Trials', 'Runner', 'State', 'Collect', 'Grade', 'Pass rates']
          .map(function (x) { return h('th', { scope: 'col' }, x); }))),
        h('tbody', null, list.runs.map(function (run) {
          return h('tr', { 'data-run': run.runId },
            h('th', { scope: 'row' }, h('a', { href: '#/runs/' + encodeURIComponent(run.runId) }, run.runId)),
            h('td', null, run.eval), h('td', null, when(run.createdAt)), h('td', { 'class': 'num' }, run.trials),
            h('td', null, run.runner), h('td', { 'class': 'state' }, run.state || '-'),
            h('td', null, run.collect), h('td', null, run.grade),
            h('td', { 'class': 'rates' }, Object.keys(run.passRates || {}).map(function (v) {
              return v + ' ' + MstReport.rate(run.passRates[v]);
            }).join(', ')));
        })))));
    }, function (e) { failure(box, 'The runs could not be listed', e); });
  }

  // A run: followed live while it runs here, then (or at once) its report.
  function runPage(id) {
    markNav('runs');
    var box = page('Run ' + id);
    var since = 0, finished = [];
    function report() {
      api('GET', '/api/v1/runs/' + encodeURIComponent(id)).then(function (view) {
        var holder = page('Run ' + id);
        MstReport.render(holder, view, function (i) {
          return api('GET', '/api/v1/runs/' + encodeURIComponent(id) + '/trials/' + i);
        }, { hashPrefix: '/runs/' + encodeURIComponent(id) + '/' });
      }, function (e) { failure(box, 'Run ' + id + ' cannot be shown', e); });
    }
    function poll() {
      api('GET', '/api/v1/runs/' + encodeURIComponent(id) + '/live?since=' + since).then(function (state) {
        // Newest first, the last 200.
        finished = state.finished.slice().reverse().concat(finished).slice(0, 200);
        since = state.next;
        drawLive(box, id, state, finished);
        if (state.done) {
          if (state.error) failure(box, 'The run failed', new Error(state.error));
          else later(report, 300);
        } else later(poll, 500);
      }, function (e) {
        if (e.status === 404) report(); else failure(box, 'Run ' + id + ' cannot be followed', e);
      });
    }
    poll();
  }

  function drawLive(box, id, state, finished) {
    while (box.firstChild) box.removeChild(box.firstChild);
    var ended = state.collected + state.infra;
    box.appendChild(h('section', { id: 'live', 'aria-labelledby': 'live-h' },
      h('h1', { id: 'live-h' }, 'Run ', id, state.done ? ' (finished)' : ' (running)'),
      h('progress', { id: 'live-progress', 'class': 'progress', max: state.total || 1, value: ended },
        ended + ' of ' + state.total),
      h('p', null, h('span', { 'data-count': 'ended' }, String(ended)), ' of ',
        h('span', { 'data-count': 'total' }, String(state.total)), ' trials: ',
        h('span', { 'data-count': 'collected' }, String(state.collected)), ' collected, ',
        h('span', { 'data-count': 'infra' }, String(state.infra)), ' infra',
        state.done ? ' \u00b7 grading done, loading the report\u2026' : ' \u00b7 graded when all are in'),
      state.running.length ? h('div', null, h('h2', null, 'Running'), h('ul', { id: 'live-running' },
        state.running.map(function (r) {
          return h('li', null, r.variant + '/' + r.case + '/' + r.trial, ': ', r.events, ' events; last: ', h('code', null, r.last));
        }))) : null,
      h('h2', null, 'Finished, newest first'),
      h('ul', { id: 'live-finished' }, finished.map(function (f) {
        return h('li', { 'data-trial': f.variant + '/' + f.case + '/' + f.trial, 'data-status': f.status },
          f.status === 'infra' ? badge('infra') : h('span', { 'class': 'badge' }, '\u2193 collected'),
          ' ', f.variant, ' / ', f.case, ' / trial ', String(f.trial), f.reason ? ': ' + f.reason : '');
      }))));
  }

  // --- playground ------------------------------------------------------------------------------

  function playgroundPage() {
    markNav('playground');
    var box = page('Playground');
    box.appendChild(h('h1', null, 'Playground'));
    api('GET', '/api/v1/info').then(function (info) {
      var p = info.playground;
      if (!p) { box.appendChild(h('p', { 'class': 'notice' }, 'This server follows one run (mst run --serve); start mst serve for the playground.')); return; }
      var variant = h('select', { id: 'boot-variant' }, p.variants.map(function (v) {
        return h('option', { value: v, selected: v === p.baseline }, v);
      }));
      var shared = h('input', { type: 'checkbox', id: 'boot-shared' });
      var conversation = h('input', { type: 'checkbox', id: 'boot-conversation' });
      var status = h('p', { id: 'boot-status', role: 'status' });
      var boot = h('button', {
        type: 'submit', id: 'boot', 'class': 'primary'
      }, 'Boot a session');
      var form = h('form', {
        'class': 'form-grid', 'aria-labelledby': 'boot-h', onsubmit: function (e) {
          e.preventDefault();
          boot.disabled = true;
          status.textContent = 'Booting a machine on ' + p.runner + '\u2026';
          var body = { variant: variant.value, sharedWorkdir: shared.checked };
          if (conversation.checked) body.conversation = true;
          api('POST', '/api/v1/sessions', body).then(function (s) {
            location.hash = '#/playground/' + encodeURIComponent(s.id);
          }, function (e) { boot.disabled = false; status.textContent = e.message; });
        }
      },
        h('h2', { id: 'boot-h' }, 'Boot a session of ', p.eval),
        h('label', null, 'Variant', variant),
        h('p', { 'class': 'meta' }, 'Runner: ', h('strong', { id: 'boot-runner' }, p.runner), ' (chosen when mst serve started: --runner)'),
        h('label', null, h('span', null, shared, ' every task in one shared work directory')),
        h('label', null, h('span', null, conversation, ' a conversation: each task is a turn continuing one thread (an api client, or a command client that declares how it resumes)')),
        h('div', null, boot), status);
      box.appendChild(form);
      return api('GET', '/api/v1/sessions').then(function (list) {
        var open = list.sessions.filter(function (s) { return s.status !== 'closed'; });
        box.appendChild(h('h2', null, 'Sessions'));
        box.appendChild(open.length ? h('ul', { id: 'sessions' }, open.map(function (s) {
          return h('li', null, h('a', { href: '#/playground/' + encodeURIComponent(s.id) }, s.id), ' \u00b7 ', s.variant,
            ' \u00b7 ', (s.tasks || []).length, ' tasks');
        })) : h('p', null, 'No open session.'));
      });
    }).catch(function (e) { failure(box, 'The playground cannot be shown', e); });
  }

  function sessionPage(id) {
    markNav('playground');
    var box = page('Session ' + id);
    var cards = h('div', { 'class': 'cards', id: 'tasks' });
    var message = h('div', { id: 'task-message', role: 'alert' });
    var input = h('textarea', { id: 'task-input', 'aria-describedby': 'task-help' });
    var asJson = h('input', { type: 'checkbox', id: 'task-json' });
    var fresh = h('input', { type: 'checkbox', id: 'task-fresh' });
    var freshLabel = h('label', { hidden: true }, h('span', null, fresh, ' start a new thread (the work directory stays)'));
    var chat = false;
    var inputLabel = h('span', null, 'Task input');
    var listHeading = h('h2', null, 'Tasks, newest first');
    var submit = h('button', { type: 'submit', id: 'submit-task', 'class': 'primary' }, 'Run task');
    var closeButton = h('button', { type: 'button', id: 'close-session', onclick: closeSession }, 'Close session');
    // The title stays one element, changed in place: each poll redraws only the line under it,
    // so the heading is never missing for a moment.
    var title = h('h1', null);
    var meta = h('div', null);
    var head = h('div', null, title, meta);
    var followed = Object.create(null);

    function say(kind, text) {
      while (message.firstChild) message.removeChild(message.firstChild);
      if (text) message.appendChild(h('p', { 'class': 'notice' + (kind === 'error' ? ' error' : '') }, text));
    }
    function drawHead(s) {
      while (meta.firstChild) meta.removeChild(meta.firstChild);
      chat = !!s.conversation;
      freshLabel.hidden = !chat;
      inputLabel.textContent = chat ? 'Message' : 'Task input';
      listHeading.textContent = chat ? 'Turns, newest first' : 'Tasks, newest first';
      title.textContent = (chat ? 'Conversation ' : 'Session ') + s.id;
      meta.appendChild(h('p', { 'class': 'meta' }, 'variant ', s.variant, chat ? ' \u00b7 conversation' : '', ' \u00b7 machine ', s.machine || '\u2013',
        ' \u00b7 ', h('span', { id: 'session-state', 'data-status': s.status }, s.status, s.ended ? ': ' + s.ended : ''),
        s.budget ? h('span', { id: 'session-budget' }, ' \u00b7 spent ', String(s.budget.spent.tokens), ' tokens',
          s.budget.spent.costUsd ? ' ($' + s.budget.spent.costUsd.toFixed(4) + ')' : '',
          (s.budget.limit || {}).tokens !== undefined ? ' of ' + s.budget.limit.tokens : '',
          (s.budget.limit || {}).costUsd !== undefined ? ' (budget $' + s.budget.limit.costUsd + ')' : '') : null));
      submit.disabled = s.status === 'closed';
      closeButton.disabled = s.status === 'closed';
    }
    function closeSession() {
      closeButton.disabled = true;
      api('DELETE', '/api/v1/sessions/' + encodeURIComponent(id)).then(function (s) {
        drawHead(s);
        say('info', 'The session is closed and its machine disposed of.');
      }, function (e) { closeButton.disabled = false; say('error', e.message); });
    }

    // One task's card, following its trace with the `since` cursor until it settles.
    function follow(task) {
      if (followed[task.id]) return;
      var status = h('span', { 'data-status': task.status }, badgeFor(task.status));
      var events = h('ol', { 'class': 'events' });
      var answer = h('div', null);
      var abort = h('button', {
        type: 'button', 'class': 'abort', onclick: function () {
          abort.disabled = true;
          api('POST', '/api/v1/sessions/' + encodeURIComponent(id) + '/tasks/' + encodeURIComponent(task.id) + '/abort', {})
            .catch(function (e) { abort.disabled = false; say('error', e.message); });
        }
      }, 'Abort');
      var count = h('span', { 'class': 'event-count' }, '0');
      // A conversation reads as a chat: the message, the reply prominent, the tool calls and
      // other events folded beneath.
      var card = chat
        ? h('article', { 'class': 'card turn', 'data-task': task.id, 'aria-label': 'Turn ' + task.n },
          h('h3', null, 'Turn ', String(task.n), task.fresh ? ' (a new thread)' : '', ' ', status, ' ', abort),
          h('div', { 'class': 'bubble user' }, typeof task.input === 'string' ? task.input : JSON.stringify(task.input, null, 2)),
          answer,
          h('details', { 'class': 'turn-events' }, h('summary', null, 'Tool calls and events (', count, ')'), events))
        : h('article', { 'class': 'card', 'data-task': task.id, 'aria-label': 'Task ' + task.n },
          h('h3', null, 'Task ', String(task.n), ' ', status, ' ', abort),
          h('details', null, h('summary', null, 'Input'), h('pre', null, JSON.stringify(task.input, null, 2))),
          events, answer);
      if (chat) answer.appendChild(h('div', { 'class': 'bubble reply pending' }, '\u2026'));
      cards.insertBefore(card, cards.firstChild);
      followed[task.id] = true;
      var since = 0;
      function poll() {
        api('GET', '/api/v1/sessions/' + encodeURIComponent(id) + '/tasks/' + encodeURIComponent(task.id) + '/trace?since=' + since)
          .then(function (page) {
            page.events.forEach(function (e) { events.appendChild(MstReport.eventItem(e)); });
            count.textContent = String(events.children.length);
            since = page.next;
            status.setAttribute('data-status', page.status);
            status.replaceChildren(badgeFor(page.status));
            if (page.done) {
              abort.remove();
              var text = page.finalText === undefined ? '(no answer)' : page.finalText;
              answer.replaceChildren(chat
                ? h('div', { 'class': 'bubble reply final-text' }, text)
                : h('div', null, h('h4', null, 'Answer'), h('pre', { 'class': 'final-text' }, text)));
              submit.disabled = false;
              // What it spent shows in the session's line.
              api('GET', '/api/v1/sessions/' + encodeURIComponent(id)).then(drawHead, function () {});
            } else later(poll, 300);
          }, function (e) { say('error', e.message); });
      }
      poll();
    }

    function send(e) {
      e.preventDefault();
      var value = input.value;
      if (asJson.checked) {
        try { value = JSON.parse(value); } catch (err) { say('error', 'The input is not valid JSON: ' + err.message); return; }
      }
      say();
      var body = { input: value };
      if (chat && fresh.checked) body.fresh = true;
      api('POST', '/api/v1/sessions/' + encodeURIComponent(id) + '/tasks', body).then(function (task) {
        fresh.checked = false;
        follow(task);
      }, function (err) {
        if (err.status === 409) say('error', 'Not started: ' + err.message);
        else say('error', err.message);
      });
    }

    box.appendChild(head);
    box.appendChild(h('form', { 'class': 'form-grid', onsubmit: send, 'aria-label': 'New task' },
      h('label', null, inputLabel, input),
      h('p', { id: 'task-help', 'class': 'meta' }, 'Sent as the case input: text, or JSON when ticked. One task runs at a time.'),
      h('label', null, h('span', null, asJson, ' the input is JSON')),
      freshLabel,
      h('div', null, submit, ' ', closeButton)));
    box.appendChild(message);
    // Keep what was good: the last completed task, or the conversation's thread, as a case.
    var datasetName = h('input', { id: 'export-dataset', value: 'playground.jsonl', 'aria-describedby': 'export-help' });
    box.appendChild(h('form', {
      'class': 'filters', 'aria-label': 'Keep as a case', onsubmit: function (e) {
        e.preventDefault();
        api('POST', '/api/v1/sessions/' + encodeURIComponent(id) + '/export', { dataset: datasetName.value }).then(function (done) {
          say('info', 'Kept as case ' + done.case.id + ' in ' + done.dataset + '.');
        }, function (err) { say('error', 'Not kept: ' + err.message); });
      }
    },
      h('label', null, 'Dataset file beside the eval', datasetName),
      h('button', { type: 'submit', id: 'export' }, 'Keep as a case'),
      h('span', { id: 'export-help', 'class': 'meta' }, 'the last completed task, or the conversation so far, as a regression case')));
    box.appendChild(listHeading);
    box.appendChild(cards);
    api('GET', '/api/v1/sessions/' + encodeURIComponent(id)).then(function (s) {
      drawHead(s);
      (s.tasks || []).forEach(follow);
    }, function (e) { failure(box, 'Session ' + id + ' cannot be shown', e); });
  }

  // A task's status, drawn like the nearest run outcome (a task is not graded).
  function badgeFor(status) {
    var outcome = { completed: 'passed', running: 'incomplete', 'timed-out': 'failed', 'over-budget': 'failed', aborted: 'missing', infra: 'infra' }[status] || 'missing';
    return badge(outcome, status);
  }

  function route() {
    takeToken();
    var hash = decodeURIComponent(location.hash.replace(/^#/, ''));
    var m;
    if ((m = /^\/runs\/([^/]+)(\/.*)?$/.exec(hash))) {
      // A trial link inside a run's page is the report's business, not a new page.
      if (m[2] && app.getAttribute('data-run') === m[1]) return;
      app.setAttribute('data-run', m[1]);
      return runPage(m[1]);
    }
    app.removeAttribute('data-run');
    if ((m = /^\/playground\/([^/]+)$/.exec(hash))) return sessionPage(m[1]);
    if (hash === '/playground') return playgroundPage();
    return runsPage();
  }
  window.addEventListener('hashchange', route);
  route();
})();
