"""A realistic coffea analysis: ttbar / HH->bbWW-like lepton + jets selection (runs in
workers, inside ``processor.process``; the helpers run on the client).

:class:`TTbarLikeProcessor` is modelled on a CMS top-pair or HH->bbWW analysis on NanoAOD
and reads what such an analysis reads (about 180 branches of a NanoAODv6/v7 file: 183 of
nano_dy.root's 1,499, 31% of its uncompressed bytes; 42% of the generated data's):

* **triggers**: an OR of single-muon, single-electron, dilepton and MET paths (``HLT_*``,
  each used if the file has it) and the MET filters (``Flag_*``);
* **primary vertex**: ``PV_*`` (number of good vertices, quality);
* **muons** and **electrons** with their identification (tight/medium/loose IDs, cut-based
  and MVA working points), isolation (PF, mini, tracker), impact parameters, and
  electron supercluster / conversion variables;
* **jets** with the inputs of jet-energy corrections (``Jet_rawFactor``, ``Jet_area``,
  ``fixedGridRhoFastjetAll``): raw pt, a toy L1FastJet-like offset and response correction
  propagated to MET (type-1-like), jet ID and pileup ID, energy fractions, b-tag
  discriminants (DeepCSV, DeepJet), b-jet regression, lepton cleaning by Delta R;
* **fat jets** (``FatJet_*``: soft-drop mass, N-subjettiness, Hbb/W/top taggers),
  **taus** (decay mode, IDs: a tau veto) and **photons** (MVA ID, pixel seed, isolation: a
  photon veto);
* **trigger objects** (``TrigObj_*``): the leading lepton matched to a muon/electron object;
* **MET** (PF: pt, phi, sumEt, significance, covariance; ``PuppiMET``; ``RawMET``), with the
  type-1-like correction from the corrected jets and the low-pt ``CorrT1METJet`` ones;
* **weights** (simulation only): ``genWeight``, ``LHEScaleWeight`` / ``PSWeight``
  envelopes, ``LHEPdfWeight`` spread, ``Pileup_nTrueInt``, ``LHE_HT``, top-pt reweighting
  from the last-copy top quarks in ``GenPart``; data get weight 1.

The corrections are toys (no correction files are shipped), but they read the same inputs
and do the same kind of per-object arithmetic as the real ones.  Optional branches (a
trigger path, a flag, a weight) are used only when the file has them, so the processor runs
on every NanoAOD version in the repository's ``data/nanoaod/`` of the NanoAODv6/v7 family and on
the generated data of :func:`testbed.synthetic.make_dataset` (resampled from
``nano_dy.root``).

Histograms: event counts per channel and cut use integer storage (exact whatever the
order in which chunks are added); weighted histograms use double storage, and
:func:`summary` rounds their sums to 10 significant digits, so outputs compare equal
across executors (float addition order differs between chunk orders by ~1e-16).

:func:`branches_read` and :func:`read_share` tell which branches a processor reads from a
file and which share of the file's uncompressed bytes they are::

    python -m examples.realistic [FILE ...]     # default: the real NanoAOD samples
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

import awkward as ak
import hist
import numpy as np
from coffea import processor

__all__ = ["TTbarLikeProcessor", "summary", "branches_read", "read_share", "CHANNELS"]

#: trigger paths used if present (OR within each group)
TRIGGERS = {
    "single_mu": ["HLT_IsoMu24", "HLT_IsoMu27", "HLT_IsoMu20", "HLT_Mu50", "HLT_IsoMu22"],
    "single_e": ["HLT_Ele32_WPTight_Gsf", "HLT_Ele35_WPTight_Gsf", "HLT_Ele32_WPTight_Gsf_L1DoubleEG",
                 "HLT_Ele27_WPTight_Gsf", "HLT_Ele32_eta2p1_WPTight_Gsf"],
    "double_mu": ["HLT_Mu17_TrkIsoVVL_Mu8_TrkIsoVVL_DZ", "HLT_Mu17_TrkIsoVVL_Mu8_TrkIsoVVL_DZ_Mass8",
                  "HLT_Mu17_TrkIsoVVL_Mu8_TrkIsoVVL"],
    "double_e": ["HLT_Ele23_Ele12_CaloIdL_TrackIdL_IsoVL", "HLT_Ele23_Ele12_CaloIdL_TrackIdL_IsoVL_DZ"],
    "mu_e": ["HLT_Mu23_TrkIsoVVL_Ele12_CaloIdL_TrackIdL_IsoVL_DZ",
             "HLT_Mu8_TrkIsoVVL_Ele23_CaloIdL_TrackIdL_IsoVL_DZ",
             "HLT_Mu12_TrkIsoVVL_Ele23_CaloIdL_TrackIdL_IsoVL_DZ"],
    "met": ["HLT_PFMET120_PFMHT120_IDTight", "HLT_PFMETNoMu120_PFMHTNoMu120_IDTight"],
}  # fmt: skip
#: MET filters used if present (AND)
MET_FILTERS = [
    "goodVertices", "globalSuperTightHalo2016Filter", "HBHENoiseFilter", "HBHENoiseIsoFilter",
    "EcalDeadCellTriggerPrimitiveFilter", "BadPFMuonFilter", "eeBadScFilter", "ecalBadCalibFilterV2",
]  # fmt: skip
CHANNELS = ["ee", "emu", "mumu", "e+jets", "mu+jets", "other"]
CUTS = ["all", "trigger", "filters", "pv", "lepton", "jets", "btag"]
#: DeepJet / DeepCSV medium working points (2018)
DEEPJET_M, DEEPCSV_M = 0.2770, 0.4184


def _opt(events, name, default=None):
    """A top-level field if the file has it (``name`` without the collection)."""
    return events[name] if name in events.fields else default


def _any_of(events, names: Sequence[str]):
    out = ak.zeros_like(events.run, dtype=bool)
    for n in names:
        if n.startswith("HLT_") and "HLT" in events.fields and n[4:] in events.HLT.fields:
            out = out | events.HLT[n[4:]]
    return out


def _delta_r(a, b):
    """Delta R of every a to its nearest b (inf when there is no b)."""
    pairs = ak.cartesian({"a": a, "b": b}, axis=1, nested=True)
    dphi = (pairs.a.phi - pairs.b.phi + np.pi) % (2 * np.pi) - np.pi
    dr = np.sqrt((pairs.a.eta - pairs.b.eta) ** 2 + dphi**2)
    return ak.fill_none(ak.min(dr, axis=2), np.inf)


def _mass(pt1, eta1, phi1, m1, pt2, eta2, phi2, m2):
    def p4(pt, eta, phi, m):
        px, py, pz = pt * np.cos(phi), pt * np.sin(phi), pt * np.sinh(eta)
        return np.sqrt(px**2 + py**2 + pz**2 + m**2), px, py, pz

    e1, x1, y1, z1 = p4(pt1, eta1, phi1, m1)
    e2, x2, y2, z2 = p4(pt2, eta2, phi2, m2)
    m2_ = (e1 + e2) ** 2 - (x1 + x2) ** 2 - (y1 + y2) ** 2 - (z1 + z2) ** 2
    return np.sqrt(np.maximum(m2_, 0))


class TTbarLikeProcessor(processor.ProcessorABC):
    """Lepton + jets / dilepton selection with corrections inputs, MET and weights."""

    def process(self, events):
        dataset = events.metadata["dataset"]
        n = len(events)
        is_mc = "genWeight" in events.fields

        # ---------------------------------------------------------------- weights
        if is_mc:
            weight = np.sign(ak.to_numpy(events.genWeight)).astype(np.float64)
            if "Pileup" in events.fields:
                # toy pileup reweighting from the true interactions
                ntrue = ak.to_numpy(events.Pileup.nTrueInt).astype(np.float64)
                weight = weight * np.clip(1.0 + 0.01 * (ntrue - 30.0), 0.5, 1.5)
            scale_up = scale_dn = np.ones(n)
            if "LHEScaleWeight" in events.fields and "nLHEScaleWeight" in events.fields:
                sw = events.LHEScaleWeight
                has = ak.num(sw) > 0
                scale_up = ak.to_numpy(ak.where(has, ak.max(sw, axis=1), 1.0)).astype(np.float64)
                scale_dn = ak.to_numpy(ak.where(has, ak.min(sw, axis=1), 1.0)).astype(np.float64)
            ps_up = np.ones(n)
            if "PSWeight" in events.fields and "nPSWeight" in events.fields:
                pw = events.PSWeight
                ps_up = ak.to_numpy(ak.fill_none(ak.max(pw, axis=1), 1.0)).astype(np.float64)
            lhe_ht = ak.to_numpy(events.LHE.HT) if "LHE" in events.fields else np.zeros(n)
            pdf_unc = np.zeros(n)
            if "LHEPdfWeight" in events.fields and "nLHEPdfWeight" in events.fields:
                pdf = events.LHEPdfWeight
                pdf_unc = ak.to_numpy(ak.fill_none(ak.std(pdf, axis=1), 0.0)).astype(np.float64)
            if "GenPart" in events.fields:
                # top-pt reweighting (data/simulation slope): last-copy top quarks
                gp = events.GenPart
                last = (gp.statusFlags & (1 << 13)) != 0
                top = gp[(np.abs(gp.pdgId) == 6) & last & (gp.genPartIdxMother >= -1)]
                sf = np.exp(0.0615 - 0.0005 * np.minimum(top.pt, 500.0))
                has2 = ak.num(top) == 2
                top_w = ak.to_numpy(ak.where(has2, np.sqrt(ak.prod(sf, axis=1)), 1.0))
                weight = weight * top_w
                # generator-level leptons and b quarks (acceptance categories)
                gen_lep = ak.to_numpy(ak.sum(((np.abs(gp.pdgId) == 11) | (np.abs(gp.pdgId) == 13))
                                             & (gp.status == 1) & (gp.pt > 10) & (np.abs(gp.eta) < 2.5)
                                             & (gp.mass >= 0) & np.isfinite(gp.phi), axis=1))  # fmt: skip
            else:
                gen_lep = np.zeros(n, dtype=np.int64)
        else:
            pdf_unc = np.zeros(n)
            gen_lep = np.zeros(n, dtype=np.int64)
            weight = np.ones(n)
            scale_up = scale_dn = ps_up = np.ones(n)
            lhe_ht = np.zeros(n)

        # ---------------------------------------------------------------- triggers, filters, PV
        trig = {k: ak.to_numpy(_any_of(events, v)) for k, v in TRIGGERS.items()}
        any_trigger = np.zeros(n, dtype=bool)
        for v in trig.values():
            any_trigger |= v
        filters = np.ones(n, dtype=bool)
        if "Flag" in events.fields:
            for f in MET_FILTERS:
                if f in events.Flag.fields:
                    filters &= ak.to_numpy(events.Flag[f])
        pv = events.PV
        good_pv = ak.to_numpy(
            (pv.npvsGood > 0) & (pv.ndof > 4) & (np.abs(pv.z) < 24) & (np.hypot(pv.x, pv.y) < 2)
            & (pv.chi2 >= 0) & (pv.npvs >= pv.npvsGood)
        )  # fmt: skip

        # ---------------------------------------------------------------- muons
        mu = events.Muon
        mu_id = (mu.tightId | (mu.mediumId & mu.isGlobal)) & mu.looseId & mu.isPFcand
        mu_quality = (mu.nStations > 0) & (mu.nTrackerLayers > 5) & (mu.ptErr / mu.pt < 0.3)
        mu_iso = (mu.pfRelIso04_all < 0.15) & (mu.miniPFRelIso_all < 0.4) & (mu.tkRelIso < 0.5)
        mu_iso = mu_iso & (mu.pfRelIso03_all < 0.5)
        mu_ip = (np.abs(mu.dxy) < 0.05) & (np.abs(mu.dz) < 0.1) & (mu.sip3d < 8)
        mu_hpt = (mu.highPtId > 0) & (mu.tunepRelPt > 0)
        good_mu = mu[(mu.pt > 15) & (np.abs(mu.eta) < 2.4) & mu_id & mu_quality & mu_iso & mu_ip]
        n_hpt = ak.to_numpy(ak.sum(mu_hpt & (mu.pt > 53), axis=1))

        # ---------------------------------------------------------------- electrons
        el = events.Electron
        sc_eta = el.eta + el.deltaEtaSC
        gap = (np.abs(sc_eta) > 1.4442) & (np.abs(sc_eta) < 1.566)
        el_id = (el.cutBased >= 3) | el.mvaFall17V2Iso_WP80 | (el.mvaFall17V2Iso_WP90 & (el.pt > 30))
        el_id = el_id & el.convVeto & (el.lostHits <= 1) & el.mvaFall17V2noIso_WPL
        el_shape = (el.sieie < 0.035) & (el.hoe < 0.15) & (np.abs(el.eInvMinusPInv) < 0.2)
        el_shape = el_shape & (el.r9 > 0.2) & (el.energyErr >= 0)
        el_iso = (el.pfRelIso03_all < 0.15) & (el.miniPFRelIso_all < 0.4)
        el_ip = (np.abs(el.dxy) < 0.05 + 0.05 * (np.abs(sc_eta) > 1.479)) & (np.abs(el.dz) < 0.2)
        el_ip = el_ip & (el.sip3d < 8)
        good_el = el[(el.pt > 15) & (np.abs(el.eta) < 2.5) & ~gap & el_id & el_shape & el_iso & el_ip]

        # ---------------------------------------------------------------- photons (veto)
        ph = events.Photon
        good_ph = (ph.pt > 20) & (np.abs(ph.eta) < 2.5) & ph.mvaID_WP90 & ph.electronVeto
        good_ph = good_ph & ~ph.pixelSeed & (ph.pfRelIso03_all < 0.2) & (ph.hoe < 0.1)
        good_ph = good_ph & (_delta_r(ph, good_mu) > 0.3) & (ph.sieie < 0.03) & (ph.r9 > 0.5)
        photon_veto = ak.to_numpy(ak.sum(good_ph, axis=1) == 0)

        # ---------------------------------------------------------------- taus (veto)
        tau = events.Tau
        good_tau = (tau.pt > 20) & (np.abs(tau.eta) < 2.3) & (np.abs(tau.dz) < 0.2)
        good_tau = good_tau & tau.idDecayModeNewDMs & (tau.decayMode != 5) & (tau.decayMode != 6)
        good_tau = good_tau & (tau.idAntiMu > 0) & (tau.idAntiEle > 0) & (tau.rawIso < 5)
        good_tau = good_tau & (tau.charge != 0) & (tau.jetIdx >= -1) & (tau.mass >= 0)
        tau_veto = ak.to_numpy(ak.sum(good_tau, axis=1) == 0)

        # ---------------------------------------------------------------- jets: toy JEC
        jet = events.Jet
        rho = events.fixedGridRhoFastjetAll
        raw_pt = jet.pt * (1 - jet.rawFactor)
        raw_mass = jet.mass * (1 - jet.rawFactor)
        offset = rho * jet.area  # L1FastJet-like pileup offset
        l1 = np.maximum(0.0, 1 - offset / np.maximum(raw_pt, 1.0))
        response = 1.0 + 0.1 * np.exp(-raw_pt * l1 / 50.0) + 0.02 * np.abs(jet.eta) / 2.5
        corr = l1 * response
        jet_pt = raw_pt * corr
        jet_mass = raw_mass * corr
        jet_id = (jet.jetId >= 2) & ((jet.puId >= 4) | (jet_pt > 50))
        fractions = (jet.chHEF + jet.neHEF + jet.chEmEF + jet.neEmEF + jet.muEF) < 1.5
        fractions = fractions & (jet.nConstituents > 1) & (jet.muonSubtrFactor >= 0)
        dr_mu = _delta_r(jet, good_mu)
        dr_el = _delta_r(jet, good_el)
        clean = (dr_mu > 0.4) & (dr_el > 0.4) & (jet.muonIdx1 >= -1) & (jet.electronIdx1 >= -1)
        clean = clean & (jet.muonIdx2 >= -1) & (jet.electronIdx2 >= -1)
        sel_jet = (jet_pt > 30) & (np.abs(jet.eta) < 2.4) & jet_id & fractions & clean
        jets_pt = jet_pt[sel_jet]
        deepjet = jet.btagDeepFlavB[sel_jet]
        deepcsv = jet.btagDeepB[sel_jet]
        csvv2 = jet.btagCSVV2[sel_jet]
        bjet = (deepjet > DEEPJET_M) & (deepcsv > -1) & (csvv2 > -1)
        breg_pt = (jets_pt * jet.bRegCorr[sel_jet])[bjet]
        breg_res = jet.bRegRes[sel_jet][bjet]
        qgl = jet.qgl[sel_jet]
        n_jets = ak.to_numpy(ak.num(jets_pt))
        n_b = ak.to_numpy(ak.sum(bjet, axis=1))
        n_b_csv = ak.to_numpy(ak.sum(deepcsv > DEEPCSV_M, axis=1))
        ht = ak.to_numpy(ak.sum(jets_pt, axis=1))
        if is_mc and "hadronFlavour" in jet.fields:
            n_true_b = ak.to_numpy(ak.sum((jet.hadronFlavour[sel_jet] == 5) & (jet.genJetIdx[sel_jet] >= 0)
                                          & (jet.partonFlavour[sel_jet] != 0), axis=1))  # fmt: skip
        else:
            n_true_b = np.zeros(n, dtype=np.int64)

        # type-1-like MET from the corrected jets (pt > 15)
        met = events.MET
        sel15 = (jet_pt > 15) & (jet.chEmEF + jet.neEmEF < 0.9)
        dpx = ak.sum(((jet_pt - raw_pt * l1) * np.cos(jet.phi))[sel15], axis=1)
        dpy = ak.sum(((jet_pt - raw_pt * l1) * np.sin(jet.phi))[sel15], axis=1)
        met_px = met.pt * np.cos(met.phi) - dpx
        met_py = met.pt * np.sin(met.phi) - dpy
        if "CorrT1METJet" in events.fields:
            # low-pt jets (below NanoAOD's Jet threshold) enter type-1 MET too
            cj = events.CorrT1METJet
            cj_pt = cj.rawPt * (1 - cj.muonSubtrFactor)
            cj_l1 = np.maximum(0.0, 1 - rho * cj.area / np.maximum(cj_pt, 1.0))
            cj_corr = cj_pt * cj_l1 * (1.0 + 0.1 * np.exp(-cj_pt / 50.0) + 0.02 * np.abs(cj.eta) / 2.5)
            cj_sel = cj_corr > 15
            met_px = met_px - ak.sum(((cj_corr - cj_pt * cj_l1) * np.cos(cj.phi))[cj_sel], axis=1)
            met_py = met_py - ak.sum(((cj_corr - cj_pt * cj_l1) * np.sin(cj.phi))[cj_sel], axis=1)
        met_t1 = ak.to_numpy(np.hypot(met_px, met_py))
        met_sig = ak.to_numpy(met.significance)
        cov_ok = ak.to_numpy((met.covXX >= 0) & (met.covYY >= 0) & np.isfinite(met.covXY))
        met_frac = ak.to_numpy(met.pt / np.maximum(met.sumEt, 1.0))
        puppi = events.PuppiMET
        puppi_pt = ak.to_numpy(puppi.pt)
        raw_met = ak.to_numpy(events.RawMET.pt) if "RawMET" in events.fields else np.zeros(n)
        puppi_ok = ak.to_numpy((puppi.sumEt >= 0) & np.isfinite(puppi.phi))
        if "RawMET" in events.fields:
            puppi_ok &= ak.to_numpy(np.isfinite(events.RawMET.phi))

        # ---------------------------------------------------------------- fat jets
        fj = events.FatJet
        fj_pt = fj.pt * (1 - fj.rawFactor) * (1 + 0.01 * events.fixedGridRhoFastjetCentral / 10)
        fj_sel = (fj_pt > 200) & (np.abs(fj.eta) < 2.4) & (fj.jetId >= 2) & (fj.area > 1.5)
        msoftdrop = fj.msoftdrop if "msoftdrop" in fj.fields else fj.mass  # NanoAOD 2015: none
        tau21 = fj.tau2 / ak.where(fj.tau1 > 0, fj.tau1, 1.0)
        tau32 = fj.tau3 / ak.where(fj.tau2 > 0, fj.tau2, 1.0)
        hbb = fj_sel & (msoftdrop > 90) & (msoftdrop < 160) & (fj.deepTagMD_HbbvsQCD > 0.8)
        wtag = fj_sel & (fj.deepTagMD_WvsQCD > 0.7) & (tau21 < 0.45) & (fj.btagDeepB > -1)
        ttag = fj_sel & (fj.deepTag_TvsQCD > 0.8) & (tau32 < 0.7) & (fj.mass > 0)
        n_hbb = ak.to_numpy(ak.sum(hbb, axis=1))
        n_boosted = ak.to_numpy(ak.sum(wtag | ttag, axis=1))
        msd = ak.to_numpy(ak.fill_none(ak.max(msoftdrop[fj_sel], axis=1), -1.0))

        # ---------------------------------------------------------------- channels
        nmu = ak.to_numpy(ak.num(good_mu))
        nel = ak.to_numpy(ak.num(good_el))
        nlep = nmu + nel
        leps_pt = ak.concatenate([good_mu.pt, good_el.pt], axis=1)
        leps_eta = ak.concatenate([good_mu.eta, good_el.eta], axis=1)
        leps_phi = ak.concatenate([good_mu.phi, good_el.phi], axis=1)
        leps_m = ak.concatenate([good_mu.mass, good_el.mass], axis=1)
        leps_q = ak.concatenate([good_mu.charge, good_el.charge], axis=1)
        order = ak.argsort(leps_pt, axis=1, ascending=False)
        leps_pt, leps_eta, leps_phi, leps_m, leps_q = (
            x[order] for x in (leps_pt, leps_eta, leps_phi, leps_m, leps_q)
        )
        two = ak.pad_none(leps_pt, 2, clip=True)
        lead_pt = ak.to_numpy(ak.fill_none(two[:, 0], 0.0))
        sub_pt = ak.to_numpy(ak.fill_none(two[:, 1], 0.0))
        p = [ak.fill_none(ak.pad_none(x, 2, clip=True), 0.0) for x in (leps_pt, leps_eta, leps_phi, leps_m, leps_q)]
        mll = ak.to_numpy(_mass(p[0][:, 0], p[1][:, 0], p[2][:, 0], p[3][:, 0],
                                p[0][:, 1], p[1][:, 1], p[2][:, 1], p[3][:, 1]))  # fmt: skip
        os_pair = ak.to_numpy(p[4][:, 0] * p[4][:, 1] < 0)
        if "TrigObj" in events.fields:
            # trigger matching of the leading lepton (muon/electron trigger objects)
            to = events.TrigObj
            to = to[((to.id == 13) | (to.id == 11)) & (to.filterBits > 0) & (to.pt > 10)]
            lead = ak.zip({"eta": p[1][:, :1], "phi": p[2][:, :1]})
            matched = ak.to_numpy(ak.fill_none(ak.firsts(_delta_r(lead, to)), np.inf) < 0.1)
        else:
            matched = np.ones(n, dtype=bool)

        channel = np.full(n, CHANNELS.index("other"))
        dilep = (nlep == 2) & os_pair & (sub_pt > 20) & (lead_pt > 25) & (mll > 12)
        channel[dilep & (nel == 2) & (trig["single_e"] | trig["double_e"])] = CHANNELS.index("ee")
        channel[dilep & (nmu == 2) & (trig["single_mu"] | trig["double_mu"])] = CHANNELS.index("mumu")
        emu = dilep & (nel == 1) & (nmu == 1) & (trig["mu_e"] | trig["single_mu"] | trig["single_e"])
        channel[emu] = CHANNELS.index("emu")
        single = (nlep == 1) & (lead_pt > 30)
        channel[single & (nel == 1) & trig["single_e"]] = CHANNELS.index("e+jets")
        channel[single & (nmu == 1) & (trig["single_mu"] | (n_hpt > 0))] = CHANNELS.index("mu+jets")

        # ---------------------------------------------------------------- cutflow
        masks = {
            "all": np.ones(n, dtype=bool),
            "trigger": any_trigger | trig["met"],
            "filters": filters,
            "pv": good_pv,
            "lepton": (nlep >= 1) & tau_veto & cov_ok & puppi_ok & (matched | (nlep >= 2)),
            "jets": (n_jets >= 1) | (n_boosted > 0),
            # signal region: a b jet (or an Hbb fat jet); dilepton: a Z/DY control region too
            "btag": (n_b >= 1) | (n_hbb > 0) | dilep,
        }
        cutflow = hist.Hist.new.StrCat(CUTS, name="cut").StrCat(CHANNELS, name="channel").Int64()
        running = np.ones(n, dtype=bool)
        for cut in CUTS:
            running = running & masks[cut]
            cutflow.fill(cut=cut, channel=np.asarray(CHANNELS, dtype=object)[channel[running]])
        sel = running

        ch = np.asarray(CHANNELS, dtype=object)[channel[sel]]
        w = weight[sel]
        h_njet = hist.Hist.new.StrCat(CHANNELS, name="channel").Integer(0, 12, name="njet").Int64()
        h_njet.fill(channel=ch, njet=n_jets[sel])
        h_nb = (hist.Hist.new.StrCat(CHANNELS, name="channel").Integer(0, 6, name="nb")
                .Integer(0, 6, name="nb_csv").Integer(0, 6, name="nb_true").Int64())  # fmt: skip
        h_nb.fill(channel=ch, nb=n_b[sel], nb_csv=n_b_csv[sel], nb_true=n_true_b[sel])
        h_ht = hist.Hist.new.StrCat(CHANNELS, name="channel").Reg(40, 0, 2000, name="ht").Weight()
        h_ht.fill(channel=ch, ht=ht[sel], weight=w)
        h_met = (hist.Hist.new.StrCat(CHANNELS, name="channel").Reg(40, 0, 400, name="met")
                 .StrCat(["nominal", "scale_up", "scale_down", "ps_up"], name="syst").Weight())  # fmt: skip
        for syst, f in (("nominal", 1.0), ("scale_up", scale_up), ("scale_down", scale_dn), ("ps_up", ps_up)):
            h_met.fill(channel=ch, met=met_t1[sel], syst=syst, weight=w * (f[sel] if np.ndim(f) else f))
        h_mll = hist.Hist.new.StrCat(CHANNELS, name="channel").Reg(60, 0, 300, name="mll").Weight()
        h_mll.fill(channel=ch, mll=mll[sel], weight=w)
        h_lep = hist.Hist.new.Reg(50, 0, 500, name="pt").Reg(20, 0, 1, name="met_frac").Int64()
        h_lep.fill(pt=lead_pt[sel], met_frac=met_frac[sel])
        h_bjet = hist.Hist.new.Reg(50, 0, 500, name="pt").Reg(20, 0, 0.5, name="res").Int64()
        h_bjet.fill(pt=ak.to_numpy(ak.flatten(breg_pt[sel])), res=ak.to_numpy(ak.flatten(breg_res[sel])))
        h_qgl = hist.Hist.new.Reg(20, -1, 1, name="qgl").Int64()
        h_qgl.fill(qgl=ak.to_numpy(ak.flatten(qgl[sel])))
        h_msd = hist.Hist.new.Reg(30, -10, 290, name="msd").Integer(0, 3, name="nhbb").Int64()
        h_msd.fill(msd=msd[sel], nhbb=n_hbb[sel])
        h_sig = hist.Hist.new.Reg(30, 0, 30, name="sig").Reg(30, 0, 600, name="puppi").Reg(
            10, 0, 1000, name="lhe_ht").Int64()  # fmt: skip
        h_sig.fill(sig=met_sig[sel], puppi=puppi_pt[sel], lhe_ht=lhe_ht[sel])
        h_raw = hist.Hist.new.Reg(30, 0, 600, name="rawmet").Reg(20, 0, 60, name="npv").Int64()
        h_raw.fill(rawmet=raw_met[sel], npv=ak.to_numpy(pv.npvsGood)[sel])
        h_gen = (hist.Hist.new.Integer(0, 5, name="gen_leptons").Integer(0, 2, name="photon_veto")
                 .Reg(20, 0, 0.2, name="pdf_unc").Int64())  # fmt: skip
        h_gen.fill(gen_leptons=gen_lep[sel], photon_veto=photon_veto[sel].astype(int), pdf_unc=pdf_unc[sel])
        return {
            dataset: {
                "entries": n,
                "selected": int(sel.sum()),
                "sumw": float(weight.sum()),
                "cutflow": cutflow,
                "njet": h_njet,
                "nb": h_nb,
                "ht": h_ht,
                "met": h_met,
                "mll": h_mll,
                "lead_lepton": h_lep,
                "bjet": h_bjet,
                "qgl": h_qgl,
                "fatjet": h_msd,
                "met_sig": h_sig,
                "raw_met": h_raw,
                "gen": h_gen,
            }
        }

    def postprocess(self, accumulator):
        return accumulator


def _round(values: np.ndarray, digits: int = 10) -> list:
    v = np.asarray(values, dtype=np.float64)
    out = np.zeros_like(v)
    nz = (v != 0) & np.isfinite(v)
    mag = np.floor(np.log10(np.abs(v[nz])))
    scale = 10.0 ** (digits - 1 - mag)
    out[nz] = np.round(v[nz] * scale) / scale
    out[~nz] = v[~nz]
    return out.tolist()


def summary(out: dict) -> dict:
    """Comparable plain-Python summary of an output: integer histograms exactly,
    weighted sums (and their variances) to 10 significant digits."""
    result = {}
    for dataset, d in sorted(out.items()):
        r: dict = {}
        for key, v in sorted(d.items()):
            if isinstance(v, hist.Hist):
                view = v.view(flow=True)
                if view.dtype.names:  # weighted storage: value and variance
                    r[key] = {"value": _round(view["value"]), "variance": _round(view["variance"])}
                else:
                    r[key] = np.asarray(view).tolist()
            elif isinstance(v, float):
                r[key] = _round(np.array([v]))[0]
            else:
                r[key] = v
        result[dataset] = r
    return result


def branches_read(proc: processor.ProcessorABC, filename: str, treename: str = "Events",
                  entry_stop: int | None = None) -> list[str]:
    """The branches ``proc`` reads from ``filename`` (coffea's access log of one chunk)."""
    import uproot
    from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

    log: list = []
    with uproot.open(filename) as f:
        stop = f[treename].num_entries if entry_stop is None else entry_stop
        events = NanoEventsFactory.from_root(
            file=f, treepath=treename, schemaclass=NanoAODSchema, mode="virtual",
            metadata={"dataset": "probe", "filename": filename}, access_log=log,
            entry_start=0, entry_stop=max(1, min(stop, 1000)),
        ).events()  # fmt: skip
        proc.process(events)
    return sorted({x.branch for x in log})


def read_share(proc: processor.ProcessorABC, files: Iterable[str],
               treename: str = "Events") -> dict:
    """Branches ``proc`` reads and their share of the files' uncompressed bytes.

    Returns ``{"branches": [...], "n_branches", "n_branches_in_file", "read_bytes",
    "total_bytes", "share"}`` summed over ``files`` (branches from the first file).
    """
    import uproot

    files = list(files)
    names = set(branches_read(proc, files[0], treename))
    read = total = 0
    n_in_file = 0
    for fn in files:
        with uproot.open(fn) as f:
            tree = f[treename]
            n_in_file = max(n_in_file, len(tree.keys(recursive=False)))
            for name, b in tree.iteritems(recursive=False):
                total += int(b.uncompressed_bytes)
                if name in names:
                    read += int(b.uncompressed_bytes)
    return {
        "branches": sorted(names),
        "n_branches": len(names),
        "n_branches_in_file": n_in_file,
        "read_bytes": read,
        "total_bytes": total,
        "share": read / total if total else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    import glob
    import os

    files = list(argv if argv is not None else sys.argv[1:])
    if not files:
        # the repository's sample folder (testbed/samples.py), computed here so that
        # ``python examples/realistic.py`` runs without the repository root on sys.path
        d = os.environ.get("CACHEAFFINITY_NANOAOD_DIR") or os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "nanoaod")
        if not os.path.isdir(d):
            print(f"no NanoAOD samples in {d}: expected the repository folder data/nanoaod/",
                  file=sys.stderr)  # fmt: skip
            return 1
        files = [f for f in sorted(glob.glob(os.path.join(d, "*.root")))
                 if os.path.basename(f) in ("nano_dy.root", "nano_dimuon.root",
                                            "nanoAOD_2015_CMS_Open_Data_ttbar.root")]  # fmt: skip
    for f in files:
        s = read_share(TTbarLikeProcessor(), [f])
        print(f"{os.path.basename(f)}: {s['n_branches']} of {s['n_branches_in_file']} branches, "
              f"{s['read_bytes'] / 1e3:.0f} of {s['total_bytes'] / 1e3:.0f} kB uncompressed "
              f"({s['share']:.1%})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
