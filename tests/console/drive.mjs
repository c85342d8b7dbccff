// Drives the toolgate console in a real headless Chromium (puppeteer-core), for
// tests/it/console.rs. Usage: node drive.mjs '<plan JSON>'; prints one JSON object.
//
// plan: {base, scenario, chromium?, screenshots, downloads?, token?, wrong_token?,
//        approval_id?, run_id?, reason?, min_events?}
// Every wait is bounded; a failed wait ends the script with {"error": ...}.
import { existsSync } from "node:fs";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

const plan = JSON.parse(process.argv[2]);
const WAIT = { timeout: plan.wait_ms || 30000 };

async function launch() {
  if (plan.chromium) {
    return puppeteer.launch({
      executablePath: plan.chromium,
      headless: true,
      args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    });
  }
  const chromium = (await import("@sparticuz/chromium")).default;
  return puppeteer.launch({
    executablePath: await chromium.executablePath(),
    headless: "shell",
    args: chromium.args,
  });
}

const seen = { console: [], page_errors: [], dialogs: [], requests: [] };

async function open(browser) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  page.on("console", (m) => seen.console.push(m.type() + ": " + m.text()));
  page.on("pageerror", (e) => seen.page_errors.push(String(e)));
  page.on("dialog", async (d) => { seen.dialogs.push(d.message()); await d.dismiss(); });
  page.on("request", (r) => seen.requests.push(r.method() + " " + r.url()));
  // Record CSP violations and anything an injected payload might set.
  await page.evaluateOnNewDocument(() => {
    window.__csp = [];
    document.addEventListener("securitypolicyviolation", (e) =>
      window.__csp.push(e.violatedDirective + " " + e.blockedURI));
  });
  await page.goto(plan.base + "/console", { waitUntil: "load" });
  return page;
}

async function signIn(page, token) {
  await page.waitForSelector("#token", { visible: true, ...WAIT });
  await page.click("#token", { clickCount: 3 });
  await page.keyboard.press("Backspace");
  if (token) await page.type("#token", token);
  await page.click("#sign-in-button");
}

async function refusalText(page, box) {
  await page.waitForSelector(box + ":not([hidden])", WAIT);
  return page.$eval(box, (b) => ({
    error_code: b.querySelector("[data-field=error_code]")?.textContent ?? null,
    reason: b.querySelector("[data-field=reason]")?.textContent ?? null,
    message: b.querySelector("[data-field=message]")?.textContent ?? null,
    text: b.textContent,
  }));
}

async function storage(page) {
  return page.evaluate(() => ({
    session_token: window.sessionStorage.getItem("toolgate.console.token"),
    local_storage_keys: window.localStorage.length,
    cookie: document.cookie,
    url: window.location.href,
  }));
}

async function shot(page, name) {
  const path = plan.screenshots + "/" + name + ".png";
  await page.screenshot({ path, fullPage: true });
  return path;
}

async function pendingCard(page, id) {
  const sel = `#pending li[data-approval-id="${id}"]`;
  await page.waitForSelector(sel, WAIT);
  return page.$eval(sel, (li) => {
    const fields = {};
    for (const dd of li.querySelectorAll("dd[data-field]")) fields[dd.dataset.field] = dd.textContent;
    return {
      title: li.querySelector("h3").textContent,
      fields,
      arguments: li.querySelector("pre[data-field=arguments]").textContent,
      elements: li.querySelectorAll("*").length,
      imgs: li.querySelectorAll("img").length,
      scripts: li.querySelectorAll("script").length,
    };
  });
}

async function injected(page) {
  return page.evaluate(() => ({
    pwned: window.__pwned === undefined ? null : window.__pwned,
    imgs: document.querySelectorAll("img").length,
    scripts: document.querySelectorAll("script").length,
    csp: window.__csp,
  }));
}

const scenarios = {
  // (c) no credential, then a wrong one: the API's structured refusal is shown.
  async refusal(page) {
    await signIn(page, "");
    const missing = await refusalText(page, "#sign-in-error");
    const screenshot_missing = await shot(page, "refusal-missing");
    await page.$eval("#sign-in-error", (b) => { b.hidden = true; });
    await signIn(page, plan.wrong_token);
    const wrong = await page.waitForFunction(() => {
      const code = document.querySelector("#sign-in-error:not([hidden]) [data-field=error_code]");
      return code && code.textContent === "TOOL_DENIED" &&
        document.querySelector("#sign-in-error [data-field=reason]")?.textContent === "credential_invalid";
    }, WAIT).then(() => refusalText(page, "#sign-in-error"));
    const screenshot = await shot(page, "refusal-wrong");
    return {
      missing, wrong, screenshot_missing, screenshot,
      storage: await storage(page),
      approvals_visible: await page.$eval("#approvals", (s) => !s.hidden),
    };
  },

  // (a) sign in, see the pending call, approve it with a reason.
  async approve(page) {
    await signIn(page, plan.token);
    const card = await pendingCard(page, plan.approval_id);
    const before = await shot(page, "approvals-pending");
    const id = plan.approval_id;
    await page.type(`textarea[id="reason-${id}"]`, plan.reason);
    await page.click(`#pending li[data-approval-id="${id}"] button.approve`);
    await page.waitForFunction((id) =>
      !document.querySelector(`#pending li[data-approval-id="${id}"]`), WAIT, id);
    await page.waitForSelector(`#recent-rows tr[data-approval-id="${id}"]`, WAIT);
    const recent = await page.$eval(`#recent-rows tr[data-approval-id="${id}"]`,
      (tr) => [...tr.children].map((td) => td.textContent));
    // The live region is cleared, then set on the next tick (so screen readers read a
    // repeated message): wait for the announcement rather than read it at once.
    await page.waitForFunction(() =>
      document.querySelector("#status").textContent.startsWith("Approved"), WAIT).catch(() => {});
    const status = await page.$eval("#status", (s) => s.textContent);
    const after = await shot(page, "approvals-approved");
    return { card, recent, live_region: status, screenshots: [before, after], storage: await storage(page) };
  },

  // (b) an approval whose arguments hold HTML and script: rendered as text only.
  async escape(page) {
    await signIn(page, plan.token);
    const card = await pendingCard(page, plan.approval_id);
    const screenshot = await shot(page, "approvals-escaped");
    let run = null;
    if (plan.run_id) {
      await page.evaluate((id) => { window.location.hash = "#runs/" + encodeURIComponent(id); }, plan.run_id);
      await page.waitForSelector("#run-facts dd[data-field=scope]", WAIT);
      run = await page.$eval("#run-facts dd[data-field=scope]", (dd) => dd.textContent);
    }
    return { card, run, screenshot, injected: await injected(page) };
  },

  // (d) the run's evidence page: timeline with verification, and the bundle download.
  async evidence(page) {
    await signIn(page, plan.token);
    await page.waitForSelector("#nav-runs", { visible: true, ...WAIT });
    await page.click("#nav-runs");
    const link = `#run-list a[href="#runs/${encodeURIComponent(plan.run_id)}"]`;
    await page.waitForSelector(link, WAIT);
    await page.click(link);
    await page.waitForFunction((n) =>
      document.querySelectorAll("#timeline-rows tr").length >= n, WAIT, plan.min_events);
    const rows = await page.$$eval("#timeline-rows tr", (trs) => trs.map((tr) => ({
      seq: Number(tr.dataset.seq),
      status: tr.dataset.status,
      cells: [...tr.children].map((td) => td.textContent),
    })));
    const log = await page.$eval("#log-status", (d) => d.textContent);
    const facts = await page.$$eval("#run-facts dd", (dds) =>
      Object.fromEntries(dds.map((dd) => [dd.dataset.field, dd.textContent])));
    const screenshot = await shot(page, "run-evidence");
    const cdp = await page.createCDPSession();
    await cdp.send("Browser.setDownloadBehavior", { behavior: "allow", downloadPath: plan.downloads });
    await page.click("#download");
    await page.waitForFunction(() =>
      document.querySelector("#download-status").textContent.startsWith("Downloaded"), WAIT);
    const download_status = await page.$eval("#download-status", (p) => p.textContent);
    // The browser writes the file after the click: wait for it (bounded) before the
    // browser is closed.
    const file = join(plan.downloads, "toolgate-run-" + plan.run_id + "-export.json");
    const deadline = Date.now() + WAIT.timeout;
    while (!existsSync(file) && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    if (!existsSync(file)) throw new Error("the bundle was not saved to " + file);
    return { rows, log, facts, screenshot, download_status, storage: await storage(page), injected: await injected(page) };
  },
};

let browser;
let out;
try {
  browser = await launch();
  const page = await open(browser);
  out = await scenarios[plan.scenario](page);
  out.browser = await browser.version();
} catch (e) {
  out = { error: String(e && e.stack || e) };
} finally {
  if (browser) await browser.close().catch(() => {});
}
out.seen = seen;
process.stdout.write(JSON.stringify(out) + "\n");
